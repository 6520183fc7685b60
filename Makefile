# Two commands matter (see README): `make run` and `make test`.
# Both create .venv on first use with the pinned CPU stack (torch 2.13.0 CPU wheel first,
# so nothing pulls a CUDA build), then reuse it.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml requirements-cpu.txt | cksum | cut -d' ' -f1)
WORKFLOW ?= workflows/ppo_async.yaml

.PHONY: install run test test-slow bench protos clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements-cpu.txt
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-cpu.txt
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $@

run: install
	$(BIN)/areal-graph run $(WORKFLOW)

# pytest exits 5 when it collects nothing: say so and fail, never pass silently.
test: install
	$(BIN)/python -m pytest -q; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-slow: install
	$(BIN)/python -m pytest -q -m slow

# bench_vs_trl.py needs TRL (the optional `bench` extra); every script prints a table and writes JSON.
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

protos: install
	$(BIN)/python -m areal_graph.protos.generate

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
