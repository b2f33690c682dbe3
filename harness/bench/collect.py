"""The benchmarks of a folder (``benchmarks/bench_*.py``), each checked against the
contract (:mod:`harness.bench.script`) without importing it, and the subset a command
line names.

The check reads each file's syntax tree: a top-level ``def parser``, a top-level
``def run`` taking the parsed arguments, and a ``bench_main(...)`` call. Importing is
left to the run (a benchmark that fails to import is reported as crashed, alone), so
collecting costs milliseconds and never runs a benchmark's imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: The checkout's benchmarks folder (the harness sits beside it).
BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
PREFIX = "bench_"


class BenchCollectionError(ValueError):
    """A benchmarks folder that cannot be run: missing, or a file without the contract."""


class UnknownBenchmarkError(ValueError):
    """A name on the command line that is no benchmark of the folder."""


@dataclass(frozen=True)
class Benchmark:
    """``name`` is the file's stem without ``bench_`` (serving for bench_serving.py)."""

    name: str
    path: Path
    #: the first line of the module's docstring
    summary: str

    @property
    def module(self) -> str:
        return self.path.stem


def contract_problems(source: str) -> list[str]:
    """What ``source`` (a benchmark module's text) lacks of the contract; empty if none."""
    tree = ast.parse(source)
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    problems = []
    if "parser" not in functions:
        problems.append("a top-level def parser() returning a BenchParser")
    run = functions.get("run")
    if run is None:
        problems.append("a top-level def run(args) returning a list of Figure")
    elif len(run.args.args) != 1:
        problems.append("run() taking exactly one argument (the parsed arguments)")
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    if "bench_main" not in calls:
        problems.append('bench_main(parser, run) under if __name__ == "__main__"')
    return problems


def collect(folder: Path = BENCHMARKS_DIR) -> list[Benchmark]:
    """Every ``bench_*.py`` of ``folder``, sorted by name; BenchCollectionError naming
    each file that breaks the contract."""
    if not folder.is_dir():
        raise BenchCollectionError(
            f"no benchmarks folder at {folder} (run from a schedscope checkout, or pass --dir)"
        )
    found, broken = [], []
    for path in sorted(folder.glob(f"{PREFIX}*.py")):
        source = path.read_text()
        try:
            problems = contract_problems(source)
        except SyntaxError as exc:
            problems = [f"valid Python ({exc.msg}, line {exc.lineno})"]
        if problems:
            broken.append(f"{path.name} lacks {'; '.join(problems)}")
            continue
        docstring = ast.get_docstring(ast.parse(source)) or ""
        found.append(
            Benchmark(path.stem.removeprefix(PREFIX), path, docstring.strip().split("\n")[0])
        )
    if broken:
        raise BenchCollectionError(
            "benchmarks that do not follow the contract (docs/benchmarks.md): " + "; ".join(broken)
        )
    if not found:
        raise BenchCollectionError(f"no {PREFIX}*.py in {folder}")
    return found


def select(benchmarks: list[Benchmark], names: list[str]) -> list[Benchmark]:
    """The benchmarks ``names`` name (serving, bench_serving or bench_serving.py), in
    the folder's order; all of them when ``names`` is empty. UnknownBenchmarkError
    names every unknown one and lists the known."""
    if not names:
        return benchmarks
    by_name = {b.name: b for b in benchmarks}
    wanted, unknown = set(), []
    for raw in names:
        name = raw.removesuffix(".py").removeprefix(PREFIX)
        if name in by_name:
            wanted.add(name)
        else:
            unknown.append(raw)
    if unknown:
        raise UnknownBenchmarkError(
            f"unknown benchmark{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"known: {', '.join(by_name)}"
        )
    return [b for b in benchmarks if b.name in wanted]
