#!/usr/bin/env bash
# The simulated gate: simulate the `mixed` profile (every policy, a quarter of its
# schedule, seed 7, the built-in cost model: the same on every machine) and gate it
# against the committed baseline with ci/gate.toml. Deterministic: any change in
# scheduling results fails until the baseline is updated in the same commit:
#
#   bash ci/gate-simulated.sh            # gate (exit 0 pass, 1 regression/changed, 2 error)
#   bash ci/gate-simulated.sh --update   # rewrite ci/baselines/simulated.json
#
# SCHEDSCOPE (default: .venv/bin/schedscope, else `schedscope`) and OUT (default: a
# temporary directory) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
SCHEDSCOPE=${SCHEDSCOPE:-$( [ -x .venv/bin/schedscope ] && echo .venv/bin/schedscope || echo schedscope )}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
BASELINE=ci/baselines/simulated.json
$SCHEDSCOPE simulate --profile mixed --policy all --duration-scale 0.25 --seed 7 \
  --cost-model builtin --out "$OUT/simulated" > "$OUT/simulate.log"
if [ "${1:-}" = "--update" ]; then
  exec $SCHEDSCOPE baseline update --from "$OUT/simulated" --out "$BASELINE"
fi
exec $SCHEDSCOPE gate --baseline "$BASELINE" --current "$OUT/simulated" \
  --config ci/gate.toml --junit "$OUT/gate-simulated.xml" --json "$OUT/gate-simulated.json"
