"""``schedscope bench`` (also ``python -m benchmarks``): run every benchmark under
``benchmarks/``, or the ones named, and print one table of their figures beside their
targets (:mod:`harness.bench.suite`; docs/benchmarks.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.text import Text

from harness.cli.app import console, err_console


def bench(
    names: list[str] = typer.Argument(
        None,
        help="Benchmarks to run (serving, bench_serving or bench_serving.py); default: all.",
        show_default=False,
    ),
    only: list[str] = typer.Option(
        [],
        "--only",
        help="Benchmarks to run, comma-separated or repeated (the same as naming them).",
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Each benchmark's short mode (all of them in under ~10 minutes on 2 cores; "
        "smaller sizes: figures are indicative).",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Write the results here (default benchmarks/results/<UTC date-time>-<machine "
        "key>.json).",
    ),
    device: str | None = typer.Option(
        None,
        "--device",
        help="cpu or cuda: where the benchmarks that run the model run it (bench_model, "
        "bench_batching, bench_serving; default: cuda when present).",
    ),
    timeout_s: float | None = typer.Option(
        None,
        "--timeout-s",
        help="Per benchmark: one still running after this is killed and reported as timed "
        "out (default 3600, --quick 300).",
    ),
    fail_on_miss: bool = typer.Option(
        False, "--fail-on-miss", help="Exit 1 when any figure misses its target."
    ),
    list_only: bool = typer.Option(
        False, "--list", help="List the benchmarks (name and what each measures) and exit."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", help="Do not echo the benchmarks' own output; only the table."
    ),
    folder: Path | None = typer.Option(
        None, "--dir", help="The benchmarks folder (default: the checkout's benchmarks/)."
    ),
) -> None:
    """Run the benchmarks (all, or those named) and print one table: benchmark, figure,
    value, target, aim, and met / missed / no target. Exit 0 when they ran (missed
    targets are reported, not failures; --fail-on-miss makes them exit 1), 1 when a
    benchmark crashed or timed out, 2 on a usage error."""
    from harness.bench.collect import (
        BENCHMARKS_DIR,
        BenchCollectionError,
        UnknownBenchmarkError,
        collect,
        select,
    )
    from harness.bench.script import DEVICES, cuda_available
    from harness.bench.suite import run_suite

    if device is not None and device not in DEVICES:
        raise typer.BadParameter(f"expected one of {', '.join(DEVICES)}", param_hint="--device")
    if device == "cuda" and not cuda_available():
        raise typer.BadParameter("torch sees no CUDA device here", param_hint="--device")
    if timeout_s is not None and timeout_s <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--timeout-s")
    wanted = [*(names or []), *(n for entry in only for n in entry.split(",") if n)]
    try:
        chosen = select(collect(folder or BENCHMARKS_DIR), wanted)
    except (BenchCollectionError, UnknownBenchmarkError) as exc:
        err_console.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
        raise typer.Exit(2) from None
    if list_only:
        for benchmark in chosen:
            console.print(f"{benchmark.name:20} {benchmark.summary}", soft_wrap=True)
        return
    outcome = run_suite(
        chosen,
        quick=quick,
        device=device,
        timeout_s=timeout_s,
        out=out,
        fail_on_miss=fail_on_miss,
        command=sys.argv,
        echo=None if quiet else _echo,
        say=_echo,
    )
    print(flush=True)
    print(outcome.table, flush=True)
    total = sum(r.wall_s for r in outcome.results)
    failed = [f"{r.benchmark.name} ({r.status})" for r in outcome.results if r.failed]
    print(f"\n{len(outcome.results)} benchmarks in {total:.0f} s; results: {outcome.out}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    raise typer.Exit(outcome.exit_code)


def _echo(line: str) -> None:
    # plain print, not rich: the benchmarks' own lines pass through as they printed them
    print(line, flush=True)
