"""``python -m benchmarks [NAME ...] [--quick] [--only ...] [--out FILE] ...``: every
benchmark (or those named), one table of figures beside targets, one results file;
the same command as ``schedscope bench`` (harness/cli/bench.py, docs/benchmarks.md)."""

import typer

from harness.cli.bench import bench

app = typer.Typer(add_completion=False)
app.command()(bench)
app(prog_name="python -m benchmarks")
