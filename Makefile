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

.PHONY: demo test install system-deps lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/schedscope run

# Debian's prometheus (prometheus + promtool), which the telemetry tests run for real,
# and Debian's chromium, which opens report.html in tests/test_report_e2e.py:
# installed when missing (as root; otherwise say how). Tests that need it fail, not
# skip, when CI=true and they are missing.
system-deps:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus (for the telemetry tests)"; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else \
	    echo "promtool is missing: run 'apt-get install -y --no-install-recommends prometheus' as root"; \
	  fi; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium (the report's headless-browser test)"; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else \
	    echo "chromium is missing: run 'apt-get install -y --no-install-recommends chromium' as root"; \
	  fi; }

test: $(STAMP) system-deps
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check engine harness loadprofiles tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
