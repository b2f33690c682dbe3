#!/usr/bin/env bash
# benchmarks/gpu.sh: the checks that need a CUDA GPU, in one prepared script that fits
# in 8 minutes (docs/benchmarks.md, "gpu.sh"). In order, each step under its own
# timeout and the whole under the budget:
#
#   machine      this machine's fingerprint (schedscope calibrate --show), nvidia-smi
#   install      the project venv (make install; skipped when PYTHON is given)
#   cuda         does torch see a CUDA device? Without one the CUDA-only steps are
#                skipped, saying so, and the rest runs on the CPU
#   tests-cuda   pytest -m torch_model with SCHEDSCOPE_TEST_DEVICE=cuda (CUDA only)
#   calibrate    schedscope calibrate --quick (the fit is stored under the results folder)
#   benchmarks   python -m benchmarks serving batching model --quick --device cuda|cpu
#
# Everything lands in one folder: $OUT when set, else benchmarks/results/gpu-<UTC time>:
# steps.tsv (step, status, seconds, log), summary.txt (what was run, skipped and why),
# one <step>.log each, pytest-cuda.xml, benchmarks.json (python -m benchmarks' results)
# and cost-models/ (the calibration's fit).
#
# Settings (environment):
#   PYTHON                       the interpreter to use (default .venv/bin/python after
#                                make install)
#   SCHEDSCOPE_GPU_BUDGET_S      the whole run's budget in seconds (default 480)
#   SCHEDSCOPE_GPU_BENCHMARKS    the benchmarks to run (default "serving batching model")
#   SCHEDSCOPE_GPU_SKIP          steps to leave out, e.g. "install calibrate"
#
# Exit 0 when every step that ran succeeded (skipped steps and missed benchmark targets
# are reported, not failures), 1 when a step failed, timed out or found no budget left.

set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

BUDGET_S=${SCHEDSCOPE_GPU_BUDGET_S:-480}
BENCHMARKS=${SCHEDSCOPE_GPU_BENCHMARKS:-serving batching model}
SKIP=" ${SCHEDSCOPE_GPU_SKIP:-} "
OUT_DIR=${OUT:-$ROOT/benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT_DIR" || exit 1
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# The calibration's fit goes with the results, where the serving benchmark finds it.
export SCHEDSCOPE_COST_MODEL_DIR=${SCHEDSCOPE_COST_MODEL_DIR:-$OUT_DIR/cost-models}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

START=$(date +%s)
FAILED=0
STEPS_FILE="$OUT_DIR/steps.tsv"
SUMMARY="$OUT_DIR/summary.txt"
printf 'step\tstatus\tseconds\tlog\n' >"$STEPS_FILE"
: >"$SUMMARY"

say() { echo "gpu.sh: $*" | tee -a "$SUMMARY"; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS_FILE"; }
skip() { record "$1" skipped 0 -; say "$1: skipped: $2"; }
skipped_by_setting() { [[ $SKIP == *" $1 "* ]]; }

# run_step NAME LIMIT_S COMMAND...: COMMAND under timeout (LIMIT_S, or what is left of
# the budget if less), its output in NAME.log; a non-zero exit or a timeout fails it.
run_step() {
    local name=$1 limit=$2
    shift 2
    if skipped_by_setting "$name"; then
        skip "$name" "SCHEDSCOPE_GPU_SKIP"
        return 0
    fi
    local left=$((BUDGET_S - ($(date +%s) - START)))
    if ((left < 10)); then
        skip "$name" "the ${BUDGET_S} s budget is spent"
        FAILED=1
        return 1
    fi
    ((limit > left)) && limit=$left
    local log="$OUT_DIR/$name.log" started code status
    started=$(date +%s)
    say "$name: running (at most ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    code=$?
    local took=$(($(date +%s) - started))
    if ((code == 0)); then
        status=ok
    elif ((code == 124 || code == 137)); then
        status="timed out"
    else
        status="failed (exit $code)"
    fi
    record "$name" "$status" "$took" "$log"
    say "$name: $status in ${took} s (log: $log)"
    if [[ $status != ok ]]; then
        FAILED=1
        tail -n 5 "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
        return 1
    fi
}

say "results in $OUT_DIR; budget ${BUDGET_S} s; benchmarks: $BENCHMARKS"

# -- the interpreter ---------------------------------------------------------------
if [[ -n ${PYTHON:-} ]]; then
    PY=$PYTHON
    skip install "PYTHON=$PYTHON given: its environment is used as it is"
else
    PY=$ROOT/.venv/bin/python
    run_step install 240 make install
fi
if ! [[ -x $PY ]] && ! command -v "$PY" >/dev/null 2>&1; then
    say "no Python at $PY: nothing more can run"
    exit 1
fi

run_step machine 60 "$PY" -m harness.cli calibrate --show
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1

# -- CUDA or not -------------------------------------------------------------------
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >"$OUT_DIR/cuda.log" 2>&1; then
    DEVICE=cuda
    record cuda ok 0 "$OUT_DIR/cuda.log"
    say "cuda: torch sees a CUDA device"
else
    DEVICE=cpu
    record cuda "no CUDA" 0 "$OUT_DIR/cuda.log"
    say "cuda: no CUDA device (torch.cuda.is_available() is False): skipping the" \
        "CUDA-only steps (tests-cuda); the calibration and the benchmarks run on the cpu"
fi

# -- the steps -----------------------------------------------------------------------
if [[ $DEVICE == cuda ]]; then
    run_step tests-cuda 180 env SCHEDSCOPE_TEST_DEVICE=cuda "$PY" -m pytest -q \
        -m torch_model -p no:cacheprovider --junitxml="$OUT_DIR/pytest-cuda.xml" tests
else
    skip tests-cuda "no CUDA device (the torch-model tests on cuda need one)"
fi
run_step calibrate 150 "$PY" -m harness.cli calibrate --quick \
    --records-dir "$OUT_DIR/calibrate-records"
# shellcheck disable=SC2086  # the list of benchmark names is meant to split
run_step benchmarks 300 "$PY" -m benchmarks $BENCHMARKS --quick --device "$DEVICE" \
    --timeout-s 120 --out "$OUT_DIR/benchmarks.json"
if [[ -f $OUT_DIR/benchmarks.log ]]; then
    # the table (the runner's last lines) into the summary
    sed -n '/^benchmark  /,$p' "$OUT_DIR/benchmarks.log" >>"$SUMMARY"
fi

say "done in $(($(date +%s) - START)) s: $([[ $FAILED == 0 ]] && echo "every step that ran succeeded" || echo "a step failed (steps.tsv)")"
exit "$FAILED"
