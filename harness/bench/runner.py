"""Runs benchmarks, each in its own subprocess (``python benchmarks/bench_NAME.py
[--quick] --json FILE``), and reads their figures.

A subprocess each: benchmarks set torch's threads, patch classes, start servers and
read their own process's memory and CPU; none of that may leak into the next, and one
that crashes (or hangs past its timeout) is reported as such while the rest still run.
A timed-out benchmark's whole process group is killed (its servers too).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.bench.collect import Benchmark
from harness.bench.figure import Figure, FigureError
from harness.bench.script import DEVICE_ENV, SKIPPED_EXIT, read_figures
from harness.processes.stop import stop_process
from harness.run.server import repo_env

OK, CRASHED, TIMED_OUT, SKIPPED = "ok", "crashed", "timed out", "skipped"
#: Lines of a failed benchmark's output kept for the report.
TAIL_LINES = 30


@dataclass
class BenchResult:
    benchmark: Benchmark
    status: str
    wall_s: float
    exit_code: int | None
    figures: list[Figure] = field(default_factory=list)
    #: why it failed: its last lines of output, or what was wrong with its figures
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def failed(self) -> bool:
        """Crashed or timed out: a skipped benchmark (this machine lacks what it needs)
        is not a failure."""
        return self.status in (CRASHED, TIMED_OUT)

    def to_dict(self) -> dict:
        return {
            "name": self.benchmark.name,
            "module": self.benchmark.module,
            "status": self.status,
            "exit_code": self.exit_code,
            "wall_s": round(self.wall_s, 3),
            "error": self.error,
            "figures": [f.to_dict() for f in self.figures],
        }


def bench_command(benchmark: Benchmark, quick: bool, json_path: Path) -> list[str]:
    return [
        sys.executable,
        str(benchmark.path),
        *(["--quick"] if quick else []),
        "--json",
        str(json_path),
    ]


def run_benchmark(
    benchmark: Benchmark,
    quick: bool = False,
    device: str | None = None,
    timeout_s: float = 1800.0,
    echo: Callable[[str], None] | None = print,
) -> BenchResult:
    """Run one benchmark to its end or ``timeout_s``; ``echo`` gets each line it prints
    (None: kept quiet). Never raises for the benchmark's own failures."""
    env = repo_env()
    if device is not None:
        env[DEVICE_ENV] = device
    with tempfile.TemporaryDirectory(prefix=f"schedscope-{benchmark.module}-") as tmp:
        json_path = Path(tmp) / "figures.json"
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        started = time.perf_counter()
        process = subprocess.Popen(
            bench_command(benchmark, quick, json_path),
            cwd=benchmark.path.parent.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a timeout kills its servers too
        )
        reader = threading.Thread(target=_pump, args=(process, tail, echo), daemon=True)
        reader.start()
        try:
            code: int | None = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            stop_process(process, 10.0, group=True)
            code = None
        reader.join(10)
        wall = time.perf_counter() - started
        output = "\n".join(tail)
        if code is None:
            return BenchResult(
                benchmark, TIMED_OUT, wall, None, error=f"ran past {timeout_s:g} s\n{output}"
            )
        if code == SKIPPED_EXIT:
            reason = output.splitlines()[-1] if output else "no reason printed"
            return BenchResult(benchmark, SKIPPED, wall, code, error=reason)
        if code != 0:
            return BenchResult(benchmark, CRASHED, wall, code, error=output)
        try:
            figures = read_figures(json_path)
        except FigureError as exc:
            return BenchResult(benchmark, CRASHED, wall, code, error=f"exited 0, but {exc}")
    if not figures:
        return BenchResult(benchmark, CRASHED, wall, code, error="exited 0 with no figures")
    return BenchResult(benchmark, OK, wall, code, figures)


def _pump(process: subprocess.Popen, tail: deque[str], echo: Callable[[str], None] | None):
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        if echo is not None:
            echo(line)
