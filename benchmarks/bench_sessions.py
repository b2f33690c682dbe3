"""Sessions and shared prefixes, the simulator beside the served engine.

1. ``chat_sessions`` (at ``--rate-scale``, ``--duration-scale``; 1x by default), served
   by ``schedscope run --profile chat_sessions --policy fcfs`` with prefix caching on
   and then off. Each run simulates its own schedule with this machine's cost model
   (its ``simulated/requests.parquet``: the same sessions, the same think times, the
   turns sent when the simulated answers end). Printed per class and for the turns
   after a session's first: TTFT and E2E p50/p95 served, simulated, and the error.
   Target: every figure within 15% with caching on (the same figures with caching off
   beside them).
2. The cache ladder (``cache_ladder``: one load at 0%, 25%, 50%, 75%, 90% prefix reuse):
   simulated under every policy, TTFT p50/p95 and hit rate per rung; with ``--served``,
   also served (``schedscope run --profile cache_ladder --policy P``) under fcfs and
   lpm. Where lpm wins or loses against fcfs: a rung whose TTFT p95 differs by more than
   10% either way.

Never fails on time (machines are shared): it reports. Served runs take the profile's
length plus the server's start (about 2.5 minutes each at 1x).

Run: .venv/bin/python benchmarks/bench_sessions.py [--rate-scale 1] [--duration-scale 1]
     [--served] [--quick: the ladder simulated only, chat_sessions at 0.3x] [--json FILE]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

from engine.config import SCHEDULING_POLICIES, EngineConfig, SchedulerConfig
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.profiles import resolve_profile
from harness.simulate.driver import simulate

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.15
#: A rung where lpm's TTFT p95 differs from fcfs's by more than this is a win or a loss.
LADDER_MARGIN = 0.10


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.sized("--duration-scale", type=float, full=1.0, quick=0.3)
    parser.add_argument(
        "--served", action="store_true", help="Also serve the cache ladder (fcfs and lpm)."
    )
    parser.sized(
        "--sessions",
        type=int,
        full=1,
        quick=0,
        help="1: serve chat_sessions with caching on and off (0: skip)",
    )
    return parser


def serve(profile: str, policy: str, out: Path, extra: list[str]) -> Path:
    """``schedscope run`` of one policy; the cell's directory."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--profile",
            profile,
            "--policy",
            policy,
            "--out",
            str(out),
            *extra,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode not in (0, 3):  # 3: the run's own verdicts (errors) said no
        raise RuntimeError(f"schedscope run failed ({done.returncode}): {done.stderr[-2000:]}")
    return out / policy


def latency(frame: pl.DataFrame) -> dict[str, float | None]:
    ok = frame.filter(pl.col("status") == "ok")
    out: dict[str, float | None] = {}
    for column in ("ttft_s", "e2e_s"):
        for q in (0.5, 0.95):
            value = ok[column].quantile(q) if ok.height else None
            out[f"{column[:-2]} p{round(q * 100)}"] = value
    return out


def ms(seconds: float | None) -> str:
    return "       -" if seconds is None else f"{seconds * 1e3:8.1f} ms"


def groups(frame: pl.DataFrame) -> dict[str, pl.DataFrame]:
    parts = {str(c): frame.filter(pl.col("class") == c) for c in sorted(set(frame["class"]))}
    parts["turns >= 2"] = frame.filter(pl.col("turn") > 1)
    return parts


def sessions_figures(args, caching: bool, root: Path) -> list[Figure]:
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    cell = serve(
        "chat_sessions",
        "fcfs",
        root / ("on" if caching else "off"),
        [
            flag,
            "--rate-scale",
            str(args.rate_scale),
            "--duration-scale",
            str(args.duration_scale),
        ],
    )
    served = pl.read_parquet(cell / "requests.parquet")
    simulated = pl.read_parquet(cell / "simulated" / "requests.parquet")
    label = "caching on" if caching else "caching off"
    later = served.filter(pl.col("turn") > 1)
    hit = later["cached_tokens"].sum() / max(later["prompt_tokens"].sum(), 1)
    print(f"chat_sessions, {label}: {served.height} turns served; turns >= 2 hit {hit:.1%}")
    figures = []
    sim_groups = groups(simulated)
    for name, part in groups(served).items():
        ours, theirs = latency(part), latency(sim_groups[name])
        for key, value in ours.items():
            sim = theirs[key]
            error = None if not value or sim is None else sim / value - 1
            print(f"  {name:<12} {key:<8} served {ms(value)}  simulated {ms(sim)}  ", end="")
            print("-" if error is None else f"{error:+.0%}")
            figures.append(
                Figure(
                    f"chat_sessions {label}: {name} {key} simulated vs served",
                    None if error is None else abs(error) * 100,
                    "%",
                    TARGET * 100 if caching else None,
                    note=f"served {value}, simulated {sim}",
                )
            )
    return figures


def ladder_table(frame: pl.DataFrame, phases: list[str]) -> pl.DataFrame:
    ok = frame.filter(pl.col("status") == "ok")
    return (
        ok.group_by("phase")
        .agg(
            pl.col("ttft_s").quantile(0.5).alias("ttft_p50"),
            pl.col("ttft_s").quantile(0.95).alias("ttft_p95"),
            (pl.col("cached_tokens").sum() / pl.col("prompt_tokens").sum()).alias("hit_rate"),
            pl.len().alias("requests"),
        )
        .sort("phase")
        .with_columns(pl.col("phase").map_elements(lambda i: phases[i], return_dtype=pl.String))
    )


def ladder_figures(args, root: Path) -> list[Figure]:
    profile = (
        resolve_profile("cache_ladder")
        .with_rate_scale(args.rate_scale)
        .with_duration_scale(args.duration_scale)
    )
    phases = [p.name for p in profile.phases]
    tables: dict[str, pl.DataFrame] = {}
    for policy in SCHEDULING_POLICIES:
        config = EngineConfig(SchedulerConfig(scheduling_policy=policy))
        tables[f"simulated {policy}"] = ladder_table(simulate(profile, config).requests, phases)
    if args.served:
        for policy in [p for p in ("fcfs", "lpm") if p in SCHEDULING_POLICIES]:
            scales = ["--rate-scale", str(args.rate_scale)]
            scales += ["--duration-scale", str(args.duration_scale)]  # run's default: 0.25
            cell = serve("cache_ladder", policy, root / f"ladder-{policy}", scales)
            tables[f"served {policy}"] = ladder_table(
                pl.read_parquet(cell / "requests.parquet"), phases
            )
    figures = []
    for name, table in tables.items():
        print(f"cache ladder, {name}:")
        for row in table.iter_rows(named=True):
            print(
                f"  {row['phase']:<9} TTFT p50 {row['ttft_p50'] * 1e3:7.1f} ms  p95 "
                f"{row['ttft_p95'] * 1e3:7.1f} ms  hit rate {row['hit_rate']:6.1%}  "
                f"({row['requests']} requests)"
            )
            figures.append(
                Figure(f"cache ladder {name} {row['phase']} TTFT p95", row["ttft_p95"] * 1e3, "ms")
            )
            figures.append(
                Figure(f"cache ladder {name} {row['phase']} hit rate", row["hit_rate"] * 100, "%")
            )
    for side in ("simulated", "served"):
        fcfs, lpm = tables.get(f"{side} fcfs"), tables.get(f"{side} lpm")
        if fcfs is None or lpm is None:
            continue
        for a, b in zip(fcfs.iter_rows(named=True), lpm.iter_rows(named=True), strict=True):
            change = b["ttft_p95"] / a["ttft_p95"] - 1 if a["ttft_p95"] else 0.0
            verdict = (
                "lpm wins"
                if change < -LADDER_MARGIN
                else "lpm loses"
                if change > LADDER_MARGIN
                else "tie"
            )
            print(f"  {side} {a['phase']}: lpm TTFT p95 {change:+.0%} against fcfs: {verdict}")
    return figures


def run(args) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        root = Path(tmp)
        if args.sessions:
            for caching in (True, False):
                figures += sessions_figures(args, caching, root)
        figures += ladder_figures(args, root)
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
