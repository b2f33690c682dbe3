#!/usr/bin/env bash
# benchmarks/gpu.sh: the checks that need a CUDA GPU, in one prepared script that fits in
# 8 minutes, on a GPU machine as it comes: no registry access needed when PYTHON is given
# and .gpu-bundle/ is present (docs/benchmarks.md, "gpu.sh"). In order, each step under
# its own timeout and the whole under the budget:
#
#   install       PYTHON given: the wheels in .gpu-bundle/ (make gpu-bundle) and this
#                 project, `pip install --no-index --no-deps --target` into a scratch
#                 folder put first on PYTHONPATH; never a registry. No PYTHON: make install
#   machine       this machine's fingerprint (schedscope calibrate --show), nvidia-smi
#   cuda          does torch see a CUDA device? Without one the CUDA-only step is
#                 skipped, saying so, and the rest runs on the CPU
#   tests-cuda    pytest -m torch_model with SCHEDSCOPE_TEST_DEVICE=cuda (CUDA only)
#   calibrate     schedscope calibrate --quick (model small on CUDA, tiny on the CPU)
#   benchmarks    python -m benchmarks gpu model batching serving --quick --device cuda|cpu
#                 (a name python -m benchmarks does not know is dropped, saying so)
#   prefix-cache  python -m benchmarks prefix_cache --quick: TTFT of a request whose 1,000-token
#                 prefix is cached vs not (skipped if engine.core.prefix_cache or the
#                 benchmark is missing)
#
# What comes back is at most 8 files in one folder, $OUT when set, else
# benchmarks/results/gpu-<UTC time>: summary.txt (what ran, what was skipped and why, the
# benchmarks' table), steps.tsv (step, status, seconds, log), calibrate.txt (the fit and
# its held-out error), benchmarks.json, pytest-cuda.xml, nvidia-smi.txt and logs.tar.gz
# (every step's full log and the calibration's fitted cost model). The scratch folder
# (the install, the calibration's records, the logs before they are packed) is under
# $TMPDIR or /tmp and removed at the end.
#
# Settings (environment):
#   PYTHON                          the interpreter (default .venv/bin/python after make
#                                   install)
#   SCHEDSCOPE_GPU_BUNDLE           the wheels folder (default .gpu-bundle)
#   SCHEDSCOPE_GPU_BUDGET_S         the whole run's budget in seconds (default 450)
#   SCHEDSCOPE_GPU_BENCHMARKS       the benchmarks (default "gpu model batching serving")
#   SCHEDSCOPE_GPU_BENCH_TIMEOUT_S  per benchmark (default 150)
#   SCHEDSCOPE_GPU_CALIBRATE_MODEL  the calibration's model (default small on CUDA, tiny
#                                   on the CPU)
#   SCHEDSCOPE_GPU_SKIP             steps to leave out, e.g. "install calibrate"
#   SCHEDSCOPE_GPU_KEEP_SCRATCH     1: keep the scratch folder (its path is in summary.txt)
#
# Exit 0 when every step that ran succeeded (skipped steps and missed benchmark targets
# are reported, not failures), 1 when a step failed, timed out or found no budget left.

set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

BUDGET_S=${SCHEDSCOPE_GPU_BUDGET_S:-450}
BENCHMARKS=${SCHEDSCOPE_GPU_BENCHMARKS-gpu model batching serving}
BENCH_TIMEOUT_S=${SCHEDSCOPE_GPU_BENCH_TIMEOUT_S:-150}
BUNDLE=${SCHEDSCOPE_GPU_BUNDLE:-$ROOT/.gpu-bundle}
SKIP=" ${SCHEDSCOPE_GPU_SKIP:-} "
OUT_DIR=${OUT:-$ROOT/benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT_DIR" || exit 1
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# Everything that does not come back lives here; its logs/ are packed into logs.tar.gz.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/schedscope-gpu.XXXXXX") || exit 1
LOGS=$WORK/logs
# the steps' own temporary files (a benchmark's records, pytest's folders) go there too
mkdir -p "$LOGS" "$WORK/tmp"
# The calibration's fit goes into a store of its own, where the serving benchmark finds it.
export SCHEDSCOPE_COST_MODEL_DIR=${SCHEDSCOPE_COST_MODEL_DIR:-$WORK/cost-models}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# The files that come back (at most 8, no folders).
RESULT_FILES="summary.txt steps.tsv calibrate.txt benchmarks.json pytest-cuda.xml nvidia-smi.txt logs.tar.gz"
MAX_FILES=8

START=$(date +%s)
FAILED=0
STEPS_FILE="$OUT_DIR/steps.tsv"
SUMMARY="$OUT_DIR/summary.txt"
printf 'step\tstatus\tseconds\tlog\n' >"$STEPS_FILE"
: >"$SUMMARY"

say() { echo "gpu.sh: $*" | tee -a "$SUMMARY"; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS_FILE"; }
skip() { record "$1" skipped 0 -; say "$1: skipped: ${*:2}"; }
skipped_by_setting() { [[ $SKIP == *" $1 "* ]]; }
elapsed() { echo $(($(date +%s) - START)); }

# run_step NAME LIMIT_S COMMAND...: COMMAND under timeout (LIMIT_S, or what is left of
# the budget if less), its output in logs/NAME.log; a non-zero exit or a timeout fails it.
run_step() {
    local name=$1 limit=$2
    shift 2
    if skipped_by_setting "$name"; then
        skip "$name" "SCHEDSCOPE_GPU_SKIP"
        return 0
    fi
    local left=$((BUDGET_S - $(elapsed)))
    if ((left < 10)); then
        skip "$name" "the ${BUDGET_S} s budget is spent"
        FAILED=1
        return 1
    fi
    ((limit > left)) && limit=$left
    local log="$LOGS/$name.log" started code status
    started=$(date +%s)
    say "$name: running (at most ${limit} s): $*"
    if declare -F "$1" >/dev/null; then # a function of this script: in a bash of its own
        env "$MARK" TMPDIR="$WORK/tmp" timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" \
            "$@" >"$log" 2>&1
    else
        env "$MARK" TMPDIR="$WORK/tmp" timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    fi
    code=$?
    reap "$name"
    local took=$(($(date +%s) - started))
    if ((code == 0)); then
        status=ok
    elif ((code == 124 || code == 137)); then
        status="timed out"
    else
        status="failed (exit $code)"
    fi
    record "$name" "$status" "$took" "logs/$name.log"
    say "$name: $status in ${took} s (log: logs/$name.log in logs.tar.gz)"
    if [[ $status != ok ]]; then
        FAILED=1
        tail -n 8 "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
        return 1
    fi
}

# Every process a step starts carries MARK in its environment. What a step leaves running
# (a benchmark in a session of its own, its server, when the step timed out) is found by
# it and ended: nothing of one step runs on into the next.
MARK=SCHEDSCOPE_GPU_RUN=$$-$START
reap() {
    local pids
    pids=$(grep -lxzF "$MARK" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
    [[ -n $pids ]] || return 0
    say "$1: ending what it left running: pids" $pids
    # shellcheck disable=SC2086  # a list of pids
    kill -TERM $pids 2>/dev/null
    sleep 3
    pids=$(grep -lxzF "$MARK" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
    # shellcheck disable=SC2086
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null
}

# pip that reads no configuration and reaches no index: only the files it is given.
offline_pip() {
    (
        for var in $(compgen -e); do
            [[ $var == PIP_* ]] && unset "$var"
        done
        export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
        exec "$PY" -m pip "$@"
    )
}

install_offline() {
    local target=$1
    echo "== the bundle: $(ls "$BUNDLE"/*.whl | wc -l) wheels from $BUNDLE"
    offline_pip install --no-index --no-deps --no-cache-dir --target "$target" "$BUNDLE"/*.whl ||
        return 1
    echo "== the project: $ROOT (setuptools from this Python, no build isolation)"
    offline_pip install --no-index --no-deps --no-build-isolation --no-cache-dir \
        --target "$target" "$ROOT" || return 1
    echo "== imports"
    PYTHONPATH="$target:$PYTHONPATH" "$PY" -c '
import importlib, sys
for name in ("locust", "harness.cli", "engine.api.app", "polars", "opentelemetry.sdk"):
    module = importlib.import_module(name)
    print(name, getattr(module, "__version__", ""), module.__file__)
'
}
# pytest's JUnit file read back (a failure's text cut to its last 5,000 characters there;
# the whole is in the log): the counts, and the tests that could not run because a
# package is missing here (a test extra the GPU machine lacks, e.g. openai or optuna: the
# module fails to import, or the test fails on that import): listed, not failed. A module
# that does import here is no excuse (a test that lost PYTHONPATH fails). Exit 1 on any
# other failure or error, or when no test passed.
JUNIT_VERDICT='
import importlib.util, re, sys, xml.etree.ElementTree as ET
OURS = ("engine", "harness", "loadprofiles", "tests", "benchmarks")
KEEP = 5000

def missing_package(text):
    found = re.search(r"No module named .([\w.]+).", text or "")
    if not found or found.group(1).split(".")[0] in OURS:
        return None
    try:
        return None if importlib.util.find_spec(found.group(1)) else found.group(1)
    except (ImportError, ValueError):
        return found.group(1)

counts = dict(passed=0, failed=0, errors=0, skipped=0)
missing = {}
tree = ET.parse(sys.argv[1])
for case in tree.getroot().iter("testcase"):
    problem = case.find("failure")
    if problem is None:
        problem = case.find("error")
    if problem is None:
        counts["skipped" if case.find("skipped") is not None else "passed"] += 1
        continue
    package = missing_package((problem.get("message") or "") + (problem.text or ""))
    name = ".".join(filter(None, (case.get("classname"), case.get("name"))))
    if problem.text and len(problem.text) > KEEP:  # the whole text is in the log
        problem.text = "[cut to its last %d characters]\n%s" % (KEEP, problem.text[-KEEP:])
    if package:
        missing.setdefault(package, []).append(name)
    else:
        counts["failed" if problem.tag == "failure" else "errors"] += 1
        print("%s: %s" % (problem.tag, name))
tree.write(sys.argv[1], encoding="utf-8", xml_declaration=True)
print(", ".join("%d %s" % (n, k) for k, n in counts.items()))
for package, names in sorted(missing.items()):
    print("not run, %s is missing here: %s" % (package, " ".join(names)))
sys.exit(1 if counts["failed"] or counts["errors"] or not counts["passed"] else 0)
'

# tests_cuda DEVICE: the torch-model tests on DEVICE, every module that imports here
tests_cuda() {
    local xml=$OUT_DIR/pytest-cuda.xml code
    # _TYPER_STANDARD_TRACEBACK: plain tracebacks from the CLI's subprocesses (Typer's own
    # print every local variable, megabytes of them)
    # shellcheck disable=SC2086  # SCHEDSCOPE_GPU_TESTS is a list of paths
    SCHEDSCOPE_TEST_DEVICE=$1 _TYPER_STANDARD_TRACEBACK=1 "$PY" -m pytest -q -m torch_model \
        -p no:cacheprovider --continue-on-collection-errors --junitxml="$xml" \
        ${SCHEDSCOPE_GPU_TESTS:-tests}
    code=$?
    echo "== pytest exited $code; its JUnit file says:"
    [[ -f $xml ]] || return "$code"
    "$PY" -c "$JUNIT_VERDICT" "$xml" >"$LOGS/tests-cuda.verdict" 2>&1
    code=$?
    cat "$LOGS/tests-cuda.verdict"
    return "$code"
}
export JUNIT_VERDICT OUT_DIR LOGS
export -f offline_pip install_offline tests_cuda

# finish: pack the logs (and the fitted cost model) into logs.tar.gz, hold $OUT to its
# files, list them, remove the scratch folder. Runs on any exit.
finish() {
    local code=$?
    trap - EXIT INT TERM
    ((code == 0)) && code=$FAILED
    [[ -d $SCHEDSCOPE_COST_MODEL_DIR ]] && cp -r "$SCHEDSCOPE_COST_MODEL_DIR" "$LOGS/cost-models"
    # anything else in $OUT (no step should leave it there) goes into the logs instead
    local path rel
    while IFS= read -r -d '' path; do
        rel=${path#"$OUT_DIR"/}
        if [[ " $RESULT_FILES " != *" $rel "* ]]; then
            mkdir -p "$LOGS/stray-out"
            mv "$path" "$LOGS/stray-out/" 2>/dev/null
            say "moved $rel (not one of the results) into logs.tar.gz: logs/stray-out/"
        fi
    done < <(find "$OUT_DIR" -mindepth 1 -maxdepth 1 -print0)
    say "done in $(elapsed) s: $([[ $code == 0 ]] && echo "every step that ran succeeded" ||
        echo "a step failed (steps.tsv)")"
    {
        echo "files in $OUT_DIR (at most $MAX_FILES):"
        (cd "$OUT_DIR" && ls -l $RESULT_FILES 2>/dev/null | awk '{printf "  %10s  %s\n", $5, $9}')
        echo "  logs.tar.gz: the packed logs"
    } | tee -a "$SUMMARY"
    cp "$SUMMARY" "$STEPS_FILE" "$LOGS/" 2>/dev/null
    tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs 2>/dev/null ||
        echo "gpu.sh: could not pack the logs" >&2
    local count
    count=$(find "$OUT_DIR" -type f | wc -l)
    if ((count > MAX_FILES)); then
        echo "gpu.sh: $count files in $OUT_DIR, more than $MAX_FILES" | tee -a "$SUMMARY"
        code=1
    fi
    if [[ ${SCHEDSCOPE_GPU_KEEP_SCRATCH:-0} == 1 ]]; then
        echo "gpu.sh: scratch kept: $WORK" | tee -a "$SUMMARY"
    else
        rm -rf "$WORK"
    fi
    exit "$code"
}
trap finish EXIT
trap 'say "interrupted"; FAILED=1; exit 1' INT TERM

say "results in $OUT_DIR; scratch $WORK; budget ${BUDGET_S} s; benchmarks: ${BENCHMARKS:-none}"

# -- install ---------------------------------------------------------------------------
if [[ -n ${PYTHON:-} ]]; then
    PY=$PYTHON
    export PY BUNDLE ROOT
    if ! [[ -x $PY ]] && ! command -v "$PY" >/dev/null 2>&1; then
        say "no Python at $PY: nothing can run"
        exit 1
    fi
    py_version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
    bundle_version=$(cat "$BUNDLE/python-version" 2>/dev/null)
    if skipped_by_setting install; then
        skip install "SCHEDSCOPE_GPU_SKIP"
    elif ! compgen -G "$BUNDLE/*.whl" >/dev/null; then
        skip install "no wheels in $BUNDLE (make gpu-bundle): PYTHON=$PY is used as it is"
    elif [[ $py_version != "$bundle_version" ]]; then
        skip install "$BUNDLE holds wheels for Python ${bundle_version:-?}, PYTHON=$PY is" \
            "Python $py_version: it is used as it is"
    else
        run_step install 150 install_offline "$WORK/site" || {
            say "the install failed: nothing more can run"
            exit 1
        }
        export PYTHONPATH="$WORK/site:$PYTHONPATH"
    fi
else
    PY=$ROOT/.venv/bin/python
    run_step install 240 make install
    if ! [[ -x $PY ]]; then
        say "no Python at $PY: nothing more can run"
        exit 1
    fi
fi

# -- machine ---------------------------------------------------------------------------
run_step machine 60 "$PY" -m harness.cli calibrate --show
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1
    say "machine: nvidia-smi: $(grep -m1 -o 'NVIDIA [A-Z0-9][^|]*' "$OUT_DIR/nvidia-smi.txt" |
        sed 's/ *$//' || echo "see nvidia-smi.txt")"
else
    say "machine: no nvidia-smi on this machine"
fi

# -- cuda ------------------------------------------------------------------------------
if "$PY" -c '
import sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit(1)
print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
' >"$LOGS/cuda.log" 2>&1; then
    DEVICE=cuda
    record cuda ok 0 logs/cuda.log
    say "cuda: torch sees a CUDA device: $(tail -n 1 "$LOGS/cuda.log")"
else
    DEVICE=cpu
    record cuda "no CUDA" 0 logs/cuda.log
    say "cuda: no CUDA device (torch.cuda.is_available() is False): skipping the" \
        "CUDA-only steps (tests-cuda); the calibration and the benchmarks run on the cpu"
fi

# -- tests-cuda ------------------------------------------------------------------------
if [[ $DEVICE == cuda ]]; then
    run_step tests-cuda 200 tests_cuda cuda
elif [[ ${SCHEDSCOPE_GPU_TESTS_ON_CPU:-0} == 1 ]]; then
    say "tests-cuda: no CUDA device: on the cpu instead (SCHEDSCOPE_GPU_TESTS_ON_CPU=1)"
    run_step tests-cuda 200 tests_cuda cpu
else
    skip tests-cuda "no CUDA device (the torch-model tests on cuda need one)"
fi
if [[ -f $LOGS/tests-cuda.verdict ]]; then
    while IFS= read -r line; do say "tests-cuda: $line"; done <"$LOGS/tests-cuda.verdict"
fi

# -- calibrate -------------------------------------------------------------------------
if [[ $DEVICE == cuda ]]; then
    CALIBRATE_MODEL=${SCHEDSCOPE_GPU_CALIBRATE_MODEL:-small}
else
    CALIBRATE_MODEL=${SCHEDSCOPE_GPU_CALIBRATE_MODEL:-tiny}
fi
# (COLUMNS: the fit's lines unwrapped, its held-out error on one line)
run_step calibrate 150 env COLUMNS=200 "$PY" -m harness.cli calibrate --quick --model "$CALIBRATE_MODEL" \
    --records-dir "$WORK/calibrate-records"
if [[ -f $LOGS/calibrate.log ]]; then
    {
        echo "schedscope calibrate --quick --model $CALIBRATE_MODEL on $DEVICE" \
            "(benchmarks/gpu.sh; the full log is logs/calibrate.log in logs.tar.gz)"
        echo
        grep -v -e '━' "$LOGS/calibrate.log"
    } >"$OUT_DIR/calibrate.txt"
    held_out=$(grep -m1 '^held-out' "$LOGS/calibrate.log")
    [[ -n $held_out ]] && say "calibrate: $held_out"
fi

# -- benchmarks ------------------------------------------------------------------------
# python -m benchmarks refuses the whole run (exit 2) for one name it does not know:
# such a name is dropped here instead, so the others still run.
if skipped_by_setting benchmarks; then
    skip benchmarks "SCHEDSCOPE_GPU_SKIP"
elif [[ -z ${BENCHMARKS// /} ]]; then
    skip benchmarks "SCHEDSCOPE_GPU_BENCHMARKS is empty"
else
    known=$("$PY" -m benchmarks --list 2>"$LOGS/benchmarks-list.log" | awk '{print $1}')
    [[ -z $known ]] && say "benchmarks: python -m benchmarks --list listed nothing" \
        "(logs/benchmarks-list.log): the names are passed on as they are"
    chosen=()
    for name in $BENCHMARKS; do
        bare=${name%.py}
        bare=${bare#bench_}
        if [[ -z $known ]] || grep -qx -- "$bare" <<<"$known"; then
            chosen+=("$name")
        else
            say "benchmarks: dropped '$name': python -m benchmarks --list does not list it"
        fi
    done
    if ((${#chosen[@]} == 0)); then
        skip benchmarks "no benchmark left of '$BENCHMARKS'"
    else
        run_step benchmarks 300 "$PY" -m benchmarks "${chosen[@]}" --quick --device "$DEVICE" \
            --timeout-s "$BENCH_TIMEOUT_S" --out "$OUT_DIR/benchmarks.json"
        # the table (the runner's last lines) into the summary; a run stopped before
        # printing it leaves what it measured in benchmarks.json (rewritten after each)
        sed -n '/^benchmark  /,$p' "$LOGS/benchmarks.log" >>"$SUMMARY"
        if ! grep -q '^benchmark  ' "$LOGS/benchmarks.log" && [[ -f $OUT_DIR/benchmarks.json ]]; then
            "$PY" -c '
import json, sys
doc = json.load(open(sys.argv[1]))
for b in doc.get("benchmarks", []):
    print("benchmarks.json holds %s: %s" % (b.get("name"), b.get("status")))
' "$OUT_DIR/benchmarks.json" 2>&1 | tee -a "$SUMMARY"
        fi
    fi
fi

# -- prefix-cache ----------------------------------------------------------------------
# Runs once the engine has prefix caching and a benchmark of it (named prefix_cache).
if skipped_by_setting prefix-cache; then
    skip prefix-cache "SCHEDSCOPE_GPU_SKIP"
elif ! "$PY" -c 'import engine.core.prefix_cache' >/dev/null 2>&1; then
    skip prefix-cache "the engine has no prefix caching yet (engine.core.prefix_cache does" \
        "not import)"
elif ! "$PY" -m benchmarks --list 2>/dev/null | grep -q '^prefix_cache '; then
    skip prefix-cache "engine.core.prefix_cache imports, but there is no prefix_cache benchmark"
else
    run_step prefix-cache 120 "$PY" -m benchmarks prefix_cache --quick --device "$DEVICE" \
        --timeout-s 110 --out "$LOGS/prefix-cache.json"
fi

exit "$FAILED"
