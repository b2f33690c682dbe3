"""What `schedscope tune` finds on the default profile, and how well the simulator's
predictions hold when the finalists are served.

The command a user types, in a subprocess: `schedscope tune --profile default --slo
"short_chat:ttft_p95<=1s" --slo "long_generation:ttft_p95<=5s"` (the profile's own TTFT
SLOs, as p95 targets) with the default budget (240 s), search and confirm settings: the
best 3 configurations and the shipped defaults (the current configuration: no knob
given) served with the torch executor at each one's predicted capacity x 0.88, 1 and
1.12 (`--confirm-margin 0.12`, not tune's default 0.15: see below), and one rate more
beyond those, up to twice, where they all met or all missed (tune's `--confirm-extend
2`), `--duration-scale 0.25`. Read back from its tune.json:

- the best served capacity under SLO among the finalists over the shipped defaults'
  (each: the highest served rate at which every class met its targets): target >= 1x;
  the winner's (the simulator's first) is printed beside it;
- per finalist, the simulator's predicted capacity against the served one, predicted /
  true - 1, where the true capacity lies between the highest rate served that met every
  SLO and the next one served, which missed (tune.json's ``off_by_range``): target
  within 15%. The worst finalist's bound is the figure; the verdict is MET when every
  finalist's whole range is within 15%, MISSED when one's is wholly outside, and
  UNDECIDED when the rates cannot tell. Margin 0.12 decides it on the side that
  matters: met at 0.88x its prediction and missed at 1x, a finalist is at most 13.6%
  optimistic (0.13 left no room for the rates' rounding to 3 digits: 2.28x x 0.87
  served as 1.98x read 15.0-15.4%). (With 0.15 a finalist 1% optimistic
  read "17% off": met at 0.85x, missed at 1x, nothing in between served.)
- the search's trials and wall time, and how many served rates the simulator said met
  the SLOs and the served run missed (no target).

Run: .venv/bin/python benchmarks/bench_tune.py [--budget-s 240] [--confirm 3]
     [--confirm-margin 0.12] [--executor torch|sim]
     [--quick: --budget-s 60 --confirm 1 --executor sim --duration-scale 0.1]
     [--tune-dir DIR: read a finished tune's DIR/tune.json instead]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.run.server import repo_env

SLOS = ["short_chat:ttft_p95<=1s", "long_generation:ttft_p95<=5s"]
TARGET_GAIN = 1.0
TARGET_ERROR = 0.15


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--budget-s", full=240.0, quick=60.0, type=float, help="the search's budget")
    parser.sized("--confirm", full=3, quick=1, type=int, help="finalists served")
    parser.sized("--executor", full="torch", quick="sim", help="the served cells' executor")
    parser.sized("--duration-scale", full=0.25, quick=0.1, type=float, help="schedule length")
    parser.add_argument(
        "--confirm-margin", type=float, default=0.12, help="tune's --confirm-margin (docstring)"
    )
    parser.add_argument(
        "--tune-dir", type=Path, default=None, help="a finished tune's --out: read, not run"
    )
    return parser


def run(args) -> list[Figure]:
    if args.tune_dir is not None:
        return figures(json.loads((args.tune_dir / "tune.json").read_text()), args, None)
    work = Path(tempfile.mkdtemp(prefix="schedscope-bench-tune-"))
    command = [sys.executable, "-m", "harness.cli", "tune", "--profile", "default"]
    for slo in SLOS:
        command += ["--slo", slo]
    command += ["--budget-s", str(args.budget_s), "--confirm", str(args.confirm)]
    command += ["--confirm-executor", args.executor, "--duration-scale", str(args.duration_scale)]
    command += ["--confirm-margin", str(args.confirm_margin)]
    command += ["--out", str(work)]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with open(work / "tune.log", "w") as log:
        proc = subprocess.run(command, env=repo_env(), stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"tune exited {proc.returncode}; log: {work / 'tune.log'}")
        return [
            Figure("served capacity, best finalist / defaults", None, "x", TARGET_GAIN, "higher"),
            Figure("simulator capacity error, worst finalist", None, "%", TARGET_ERROR * 100),
        ]
    tune = json.loads((work / "tune.json").read_text())
    print(f"tune took {wall:.0f} s; load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"(files: {work})")
    return figures(tune, args, wall)


def figures(tune: dict, args, wall: float | None) -> list[Figure]:
    confirmed = {c["label"]: c for c in (tune["confirm"] or {}).get("configurations", [])}
    current = confirmed.get("current")
    finalists = {k: c for k, c in confirmed.items() if k != "current"}
    # a finalist not measured (no served cell gave data: None) is not a capacity of 0
    measured_finalists = [c["measured_capacity"] for c in finalists.values()]
    best = max((m for m in measured_finalists if m is not None), default=None)
    base = current["measured_capacity"] if current else None
    gain = ratio(best, base)
    winner = ratio(finalists["c1"]["measured_capacity"], base) if "c1" in finalists else None
    bounds, verdicts = [], []
    for label, c in confirmed.items():
        predicted, measured = c["predicted"]["capacity"], c["measured_capacity"]
        low, high = c.get("off_by_range") or bracket(c)  # tune.json files before the range
        verdict = within(low, high, TARGET_ERROR)
        verdicts.append(verdict)
        bounds.append(worst_bound(low, high))
        below = c.get("measured_capacity_below")
        print(
            f"{label:8}: predicted {predicted or 0:.3g}x, "
            + ("not measured" if measured is None else f"measured {measured:.3g}x")
            + (f" (missed at {below:.3g}x)" if below else "")
            + f", off by {span(low, high)}: {verdict}"
            + (f"; missed at {c['missed']}" if c["missed"] else "")
        )
    worst = max(bounds, default=None)
    if "MISSED" in verdicts:
        overall = "MISSED"
    elif "UNDECIDED" in verdicts or not verdicts:
        overall = "UNDECIDED (the served rates cannot tell)"
    else:
        overall = "MET"
    missed = sum(len(c["missed"]) for c in confirmed.values())
    search = tune["search"]
    print(
        f"search: {search['trials']} trials, {search['simulations']} simulations in "
        f"{search['elapsed_s']:.0f} s (stopped by {search['stopped_by']})"
    )
    print(f"winner (c1) / defaults: {'-' if winner is None else f'{winner:.2f}x'}")
    print(
        f"best served finalist / defaults: {'-' if gain is None else f'{gain:.2f}x'}, "
        f"target >= {TARGET_GAIN:g}x: "
        + (
            f"not measured ({no_ratio(best, base)})"
            if gain is None
            else "MET"
            if gain >= TARGET_GAIN
            else "MISSED"
        )
    )
    print(
        f"worst simulator capacity error (bound): "
        f"{'-' if worst is None or worst == float('inf') else f'{worst:.1%}'}, "
        f"target within {TARGET_ERROR:.0%}: {overall}"
    )
    note = f"{args.executor} executor, duration scale {args.duration_scale:g}"
    unmeasured = no_ratio(best, base)
    gain_note = f"{note}; not measured: {unmeasured}" if unmeasured else note
    return [
        Figure(
            "served capacity, winner / defaults", gain, "x", TARGET_GAIN, "higher", note=gain_note
        ),
        Figure(
            "simulator capacity error, worst finalist",
            None if worst is None or worst == float("inf") else worst * 100,
            "%",
            TARGET_ERROR * 100,
            note=note,
        ),
        Figure("search trials", float(search["trials"]), "", note=f"{search['elapsed_s']:.0f} s"),
        Figure("served rates missed that the simulator said meet", float(missed), ""),
        *([Figure("tune wall time", wall, "s")] if wall is not None else []),
    ]


def bracket(c: dict) -> tuple[float | None, float | None]:
    """tune.json's off_by_range, from its served rates (for files written before it)."""
    capacity = c["predicted"].get("capacity")
    measured = c["measured_capacity"] or 0.0
    # a cell with no data (meets null) is not a miss
    above = [
        float(r) for r, v in c["measured"].items() if float(r) > measured and v["meets"] is False
    ]
    if not capacity:
        return None, None
    return (capacity / min(above) - 1 if above else None), c["off_by"]


def within(low: float | None, high: float | None, target: float) -> str:
    """The error lies in (low, high] (None: unbounded on that side). MET when all of it is
    within +-target, MISSED when none of it is, else UNDECIDED."""
    lo = -float("inf") if low is None else low
    hi = float("inf") if high is None else high
    if -target <= lo and hi <= target:
        return "MET"
    if lo > target or hi < -target:
        return "MISSED"
    return "UNDECIDED"


def worst_bound(low: float | None, high: float | None) -> float:
    """The largest error the range allows (infinity when unbounded)."""
    if low is None or high is None:
        return float("inf")
    return max(abs(low), abs(high))


def span(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "-"
    if high is None:
        return f"more than {low:+.1%}"
    if low is None:
        return f"{high:+.1%} or less"
    return f"{low:+.1%} to {high:+.1%}"


def no_ratio(value: float | None, base: float | None) -> str:
    """Why value / base has no value ("" when it has one)."""
    if base == 0:
        return "the defaults met no rate served (capacity 0): no ratio"
    if base is None:
        return "the defaults' capacity was not measured"
    if value is None:
        return "no finalist's capacity was measured"
    return ""


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base; None when either was not measured, or the base met no rate served
    (0: no finite ratio, not a gain)."""
    if value is None or base is None or base == 0:
        return None
    return value / base


if __name__ == "__main__":
    bench_main(parser, run)
