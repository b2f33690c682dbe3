"""One command for every benchmark (``python -m benchmarks``, ``schedscope bench``):
the selected benchmarks run one after another (:mod:`harness.bench.runner`), then one
table of every figure (:mod:`harness.bench.table`) and one results file
(:mod:`harness.bench.results`), rewritten after each benchmark.

Exit status: 0 when every benchmark ran, whatever its figures (a missed target is
reported, not a failure; a benchmark skipped because this machine lacks what it needs
is reported too), unless ``fail_on_miss``; 1 when a benchmark crashed or timed out (or,
with ``fail_on_miss``, a target was missed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.bench.collect import Benchmark
from harness.bench.figure import MISSED
from harness.bench.results import (
    default_out,
    machine_fingerprint,
    results_document,
    write_results,
)
from harness.bench.runner import BenchResult, run_benchmark
from harness.bench.table import render_table

#: Per benchmark, unless given: the full runs take minutes each (bench_batching's
#: 1,024 requests on 2 cores the longest); --quick ones well under one.
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_QUICK_TIMEOUT_S = 300.0


@dataclass
class SuiteOutcome:
    results: list[BenchResult]
    table: str
    out: Path
    exit_code: int


def exit_code(results: list[BenchResult], fail_on_miss: bool) -> int:
    if any(r.failed for r in results):
        return 1
    if fail_on_miss and any(f.verdict == MISSED for r in results for f in r.figures):
        return 1
    return 0


def run_suite(
    benchmarks: list[Benchmark],
    quick: bool = False,
    device: str | None = None,
    timeout_s: float | None = None,
    out: Path | None = None,
    fail_on_miss: bool = False,
    command: list[str] | None = None,
    echo: Callable[[str], None] | None = print,
    say: Callable[[str], None] = print,
) -> SuiteOutcome:
    """Run ``benchmarks`` in order; ``say`` gets one line as each starts and ends,
    ``echo`` each line they print (None: quiet)."""
    fp = machine_fingerprint(device)
    started = datetime.now(UTC)
    limit = timeout_s or (DEFAULT_QUICK_TIMEOUT_S if quick else DEFAULT_TIMEOUT_S)
    say(f"machine: {fp.describe()}")
    path = out or default_out(fp, started)
    results: list[BenchResult] = []
    for n, benchmark in enumerate(benchmarks, 1):
        say(f"== {n}/{len(benchmarks)} {benchmark.module}{' --quick' if quick else ''} ==")
        result = run_benchmark(benchmark, quick, device, limit, echo)
        tail = "" if result.ok else f": {result.error.splitlines()[-1] if result.error else ''}"
        say(f"== {benchmark.module}: {result.status} in {result.wall_s:.1f} s{tail}")
        results.append(result)
        # after each benchmark: a run stopped from outside keeps what it measured
        write_results(results_document(results, fp, started, quick, device, command or []), path)
    return SuiteOutcome(results, render_table(results), path, exit_code(results, fail_on_miss))
