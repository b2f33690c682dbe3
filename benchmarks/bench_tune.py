"""What `schedscope tune` finds on the default profile, and how well the simulator's
predictions hold when the finalists are served.

The command a user types, in a subprocess: `schedscope tune --profile default --slo
"short_chat:ttft_p95<=1s" --slo "long_generation:ttft_p95<=5s"` (the profile's own TTFT
SLOs, as p95 targets) with the default budget (240 s), search and confirm settings: the
best 3 configurations and the shipped defaults (the current configuration: no knob
given) served with the torch executor at each one's predicted capacity x 0.85, 1 and
1.15 (`--confirm-margin 0.15`), `--duration-scale 0.25`. Read back from its tune.json:

- the best served capacity under SLO among the finalists over the shipped defaults'
  (each: the highest served rate at which every class met its targets): target >= 1x;
  the winner's (the simulator's first) is printed beside it;
- per finalist, the simulator's predicted capacity against the served one:
  |predicted / measured - 1|, the worst of them: target <= 15% (the three served rates
  can tell 15% apart: a finalist that met at 1.15x its prediction, or missed at 0.85x,
  is more than 15% off);
- the search's trials and wall time, and how many served rates the simulator said met
  the SLOs and the served run missed (no target).

Run: .venv/bin/python benchmarks/bench_tune.py [--budget-s 240] [--confirm 3]
     [--executor torch|sim] [--quick: --budget-s 60 --confirm 1 --executor sim
     --duration-scale 0.1] [--tune-dir DIR: read a finished tune's DIR/tune.json instead]
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
    best = max((c["measured_capacity"] or 0.0 for c in finalists.values()), default=None)
    base = current["measured_capacity"] if current else None
    gain = ratio(best, base)
    winner = ratio(finalists["c1"]["measured_capacity"], base) if "c1" in finalists else None
    errors = []
    for label, c in confirmed.items():
        predicted, measured = c["predicted"]["capacity"], c["measured_capacity"]
        error = abs(c["off_by"]) if c["off_by"] is not None else None
        errors.append(error if error is not None else float("inf"))
        print(
            f"{label:8}: predicted {predicted or 0:.3g}x, measured {measured or 0:.3g}x, "
            f"off by {'-' if error is None else f'{error:.0%}'}"
            + (f"; missed at {c['missed']}" if c["missed"] else "")
        )
    worst = max(errors, default=None)
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
        f"{'MET' if gain is not None and gain >= TARGET_GAIN else 'MISSED'}"
    )
    print(
        f"worst simulator capacity error: {'-' if worst is None else f'{worst:.0%}'}, "
        f"target <= {TARGET_ERROR:.0%}: "
        f"{'MET' if worst is not None and worst <= TARGET_ERROR else 'MISSED'}"
    )
    note = f"{args.executor} executor, duration scale {args.duration_scale:g}"
    return [
        Figure("served capacity, winner / defaults", gain, "x", TARGET_GAIN, "higher", note=note),
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


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base; infinity when only the base met no rate served."""
    if value is None or base is None:
        return None
    if base == 0:
        return float("inf") if value > 0 else None
    return value / base


if __name__ == "__main__":
    bench_main(parser, run)
