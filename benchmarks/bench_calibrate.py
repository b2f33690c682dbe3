"""How long `schedscope calibrate` (the served method) takes and how well its fit holds
out, quick and full, measured beside the targets.

Each run is the command a user types (`python -m harness.cli calibrate [--quick]`), in
a subprocess, timed from start to exit: the server's start-up, the calibration
schedule's served run, the fit. The held-out error is the fit's own (every fifth
step held out, docs/execution.md). The machine's load average is printed before and
after each run: on a shared machine a busy neighbour shows up in both the duration and
the error.

Targets: --quick within 90 s on 2 cores with held-out median error <= 10%; the full
calibration within 10 minutes, aiming at <= 5%. Never fails on time: it reports.

Run: .venv/bin/python benchmarks/bench_calibrate.py [--skip-full] [--executor sim
     --cost-model FILE] [--quick: the quick calibration only, as --skip-full] [--json FILE]
"""

from __future__ import annotations

import dataclasses
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

TARGETS = {"quick": (90.0, 0.10), "full": (600.0, 0.05)}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} cores"


def calibrate(kind: str, args, work: Path) -> list[Figure]:
    out = work / f"{kind}.json"
    command = [sys.executable, "-m", "harness.cli", "calibrate", "--out", str(out)]
    command += ["--records-dir", str(work / kind), "--executor", args.executor]
    command += ["--quick"] if kind == "quick" else []
    command += ["--cost-model", str(args.cost_model)] if args.cost_model else []
    before = load()
    started = time.perf_counter()
    proc = subprocess.run(command, env=repo_env(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    max_s, max_err = TARGETS[kind]
    duration = Figure(f"calibrate {kind} duration", wall, "s", max_s)
    if proc.returncode != 0:
        print(f"{kind}: calibrate exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        error = Figure(f"calibrate {kind} held-out median error", None, "%", max_err * 100)
        return [dataclasses.replace(duration, value=None), error]
    fit = json.loads(out.read_text())["fit"]
    served = fit["served"]
    err = fit["holdout_median_rel_error"]
    print(
        f"{kind:5}: {wall:6.1f} s (served run {served['served_s']:.1f} s, {served['requests']} "
        f"requests, {served['steps']} steps), target <= {max_s:.0f} s: "
        f"{'MET' if wall <= max_s else 'MISSED'}; held-out median error {err:.1%} "
        f"(p90 {fit['holdout_p90_rel_error']:.1%}, {fit['holdout_points']} steps), "
        f"target <= {max_err:.0%}: {'MET' if err <= max_err else 'MISSED'}"
    )
    noise = served.get("step_noise")
    print(
        f"       coverage {served['coverage']}; step-to-step noise "
        f"{'-' if noise is None else f'{noise:.1%}'}; {before} before, {load()} after"
    )
    note = f"{args.executor} executor; {load()}"
    return [
        dataclasses.replace(duration, note=note),
        Figure(f"calibrate {kind} held-out median error", err * 100, "%", max_err * 100),
    ]


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument(
        "--skip-full", action="store_true", help="only the quick calibration (as --quick)"
    )
    parser.add_argument("--executor", default="torch", choices=["torch", "sim"])
    parser.add_argument("--cost-model", type=Path, default=None, help="the sim's truth")
    return parser


def run(args) -> list[Figure]:
    work = Path(tempfile.mkdtemp(prefix="schedscope-bench-calibrate-"))
    figures = []
    for kind in ("quick",) if args.skip_full or args.quick else ("quick", "full"):
        figures += calibrate(kind, args, work)
    print(f"(files: {work})")
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
