# schedscope: `make demo` runs the main job, `make test` runs the whole test suite.
# Both create .venv on first use: torch first, pinned (on a CPU-only machine this
# must not pull a multi-GB CUDA build: pass TORCH_INDEX=https://download.pytorch.org/whl/cpu
# where the CPU wheel is not already available locally), then the project.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.schedscope-installed

.PHONY: demo test install lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/schedscope simulate --profile default --policy all --out runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check engine harness loadprofiles tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
