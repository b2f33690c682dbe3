#!/usr/bin/env bash
# The GPU machine's run of benchmarks/gpu.sh, rehearsed here (`make gpu-rehearsal`, CI):
# a Python 3.12 virtualenv that holds exactly benchmarks/gpu-image.txt (what that
# machine's Python holds, torch's CUDA libraries included), and gpu.sh run in it with the
# bundle (.gpu-bundle/, `make gpu-bundle`) and no network: in a network namespace of its
# own where this runs as root (else behind a proxy that answers nothing). No CUDA here, so
# the CUDA steps are skipped, saying so; the install from the bundle and the calibration
# really run. Then the results are checked: exit 0, every step's status, at most 8 files
# at most 2 folders down in OUT. docs/benchmarks.md, "gpu.sh".
#
# The virtualenv (.venv-gpu-rehearsal, ~5 GB) is built once, again when gpu-image.txt
# changes. Settings: GPU_REHEARSAL_PYTHON (a Python 3.12; default: pyenv's 3.12.*, else
# python3.12 on PATH), GPU_REHEARSAL_VENV, GPU_REHEARSAL_OUT (default: a new temporary
# folder, removed when the rehearsal passes); gpu.sh's own settings (SCHEDSCOPE_GPU_*)
# pass through: its default benchmarks run here too, on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${GPU_REHEARSAL_VENV:-.venv-gpu-rehearsal}
IMAGE=benchmarks/gpu-image.txt
BUNDLE=.gpu-bundle
STAMP=$VENV/.schedscope-gpu-image
started=$(date +%s)
say() { echo "gpu-rehearsal: $*"; }
fail() {
    say "FAILED: $*"
    exit 1
}

is_312() { [[ -x $1 ]] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
find_python312() {
    local candidate root
    if [[ -n ${GPU_REHEARSAL_PYTHON:-} ]]; then
        is_312 "$GPU_REHEARSAL_PYTHON" && echo "$GPU_REHEARSAL_PYTHON"
        return
    fi
    root=$(pyenv root 2>/dev/null || true)
    for candidate in ${root:+"$root"/versions/3.12.*/bin/python3} \
        /root/.pyenv/versions/3.12.*/bin/python3 "$(command -v python3.12 || true)"; do
        if is_312 "$candidate"; then
            echo "$candidate"
            return
        fi
    done
}

# -- the image's Python ------------------------------------------------------------------
[[ -f $BUNDLE/python-version ]] || fail "no bundle in $BUNDLE: run make gpu-bundle first"
image_key=$(sha256sum "$IMAGE" | cut -c1-16)
if [[ $(cat "$STAMP" 2>/dev/null) != "$image_key" ]]; then
    PY312=$(find_python312 || true)
    [[ -n $PY312 ]] || fail "no Python 3.12 found (pyenv's versions/3.12.*, python3.12 on" \
        "PATH, or GPU_REHEARSAL_PYTHON): install one, e.g. pyenv install 3.12"
    say "building $VENV from $IMAGE with $PY312 (once; torch's CUDA libraries are ~5 GB)"
    rm -rf "$VENV"
    "$PY312" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        -r "$IMAGE"
    "$VENV/bin/python" -c 'import torch, numpy, aiohttp, typer, pytest'
    echo "$image_key" >"$STAMP"
fi
# exactly the image: every line of the list, nothing else
wanted=$(grep -o '^[A-Za-z0-9][A-Za-z0-9._-]*' "$IMAGE" | tr 'A-Z_.' 'a-z--' | sort)
have=$("$VENV/bin/python" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null |
    cut -d= -f1 | tr 'A-Z_.' 'a-z--' | sort)
[[ $wanted == "$have" ]] || fail "$VENV is not exactly $IMAGE:" \
    "$(diff <(echo "$wanted") <(echo "$have") | grep '^[<>]' | tr '\n' ' ')"
say "$VENV holds exactly $IMAGE ($(echo "$have" | wc -l) packages); $(make --no-print-directory gpu-bundle)"

# -- gpu.sh, offline ---------------------------------------------------------------------
if [[ -n ${GPU_REHEARSAL_OUT:-} ]]; then
    OUT=$GPU_REHEARSAL_OUT
    scratch=
else
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/schedscope-gpu-rehearsal.XXXXXX")
    OUT=$scratch/out
fi
rm -rf "$OUT"
gpu_env=(
    env PYTHON="$ROOT/$VENV/bin/python" OUT="$OUT" CUDA_VISIBLE_DEVICES=
    # should anything still try the network, it meets a proxy that answers nothing
    http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9
    HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9
    no_proxy=localhost,127.0.0.1,::1 NO_PROXY=localhost,127.0.0.1,::1
)
if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null && command -v ip >/dev/null &&
    unshare --net true 2>/dev/null; then
    say "running benchmarks/gpu.sh with no network (a network namespace with loopback only)"
    set +e
    unshare --net bash -c 'ip link set lo up && exec "$@"' _ "${gpu_env[@]}" bash benchmarks/gpu.sh
    code=$?
    set -e
else
    say "running benchmarks/gpu.sh behind a proxy that answers nothing (no network namespace here)"
    set +e
    "${gpu_env[@]}" bash benchmarks/gpu.sh
    code=$?
    set -e
fi

# -- the checks --------------------------------------------------------------------------
problems=()
((code == 0)) || problems+=("gpu.sh exited $code")
declare -A expected=(
    [install]=ok [machine]=ok [cuda]="no CUDA" [tests-cuda]=skipped [calibrate]=ok
    [benchmarks]=ok [prefix-cache]=ok
)
if [[ -f $OUT/steps.tsv ]]; then
    for step in install machine cuda tests-cuda calibrate benchmarks prefix-cache; do
        status=$(awk -F'\t' -v s="$step" '$1 == s {print $2}' "$OUT/steps.tsv")
        [[ $status == "${expected[$step]}" ]] ||
            problems+=("step $step: '${status:-missing}', expected '${expected[$step]}'")
    done
else
    problems+=("no steps.tsv in $OUT")
fi
files=$(cd "$OUT" 2>/dev/null && find . -type f | sed 's|^\./||' | sort || true)
count=$(echo "$files" | grep -c . || true)
((count <= 8)) || problems+=("$count files in OUT, more than 8")
deep=$(echo "$files" | awk -F/ 'NF > 3 && n++ < 3')
[[ -z $deep ]] || problems+=("files more than 2 folders down: $deep")
odd=$(echo "$files" | grep -v '^[A-Za-z0-9._/-]*$' || true)
[[ -z $odd ]] || problems+=("names outside letters, digits, '.', '_', '-': $odd")
grep -q '^held-out' "$OUT/calibrate.txt" 2>/dev/null || problems+=("no held-out error in calibrate.txt")
grep -q 'tests-cuda: skipped: no CUDA device' "$OUT/summary.txt" 2>/dev/null ||
    problems+=("summary.txt does not say why tests-cuda was skipped")
packed=$(tar -tzf "$OUT/logs.tar.gz" 2>/dev/null || true)
for log in install machine calibrate benchmarks; do
    grep -qx "logs/$log.log" <<<"$packed" || problems+=("logs.tar.gz lacks logs/$log.log")
done

echo
echo "== $OUT"
while read -r f; do
    if [[ -n $f ]]; then printf '  %10s  %s\n' "$(stat -c %s "$OUT/$f")" "$f"; fi
done <<<"$files"
echo
if ((${#problems[@]})); then
    for p in "${problems[@]}"; do say "problem: $p"; done
    fail "$((${#problems[@]})) problem(s) in $(($(date +%s) - started)) s"
fi
say "passed in $(($(date +%s) - started)) s: every step as expected, $count files in $OUT"
# kept when it failed, or when GPU_REHEARSAL_OUT named it
[[ -z $scratch ]] || rm -rf "$scratch"
