"""Benchmark modules written into a test's folder: cheap stand-ins that follow (or
break) the contract of harness/bench/script.py, for the runner's tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

#: Two figures beside targets, one lower- and one higher-is-better, one without.
GOOD = '''
"""A fake benchmark that meets one target and misses another."""
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main


def parser():
    parser = BenchParser(description=__doc__)
    parser.sized("--size", type=int, full=100, quick=10)
    return parser


def run(args):
    print(f"size {args.size}, quick {args.quick}")
    return [
        Figure("latency", 0.5, "ms", 1.0, "lower"),
        Figure("throughput", 90.0, "tokens/s", 100.0, "higher"),
        Figure("size", float(args.size), "requests"),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
'''

CRASHES = '''
"""A fake benchmark that raises."""
from harness.bench.script import BenchParser, bench_main


def parser():
    return BenchParser()


def run(args):
    raise RuntimeError("the fake benchmark fell over")


if __name__ == "__main__":
    bench_main(parser, run)
'''

SKIPS = '''
"""A fake benchmark that needs something this machine lacks."""
from harness.bench.script import BenchParser, bench_main, skip


def parser():
    return BenchParser()


def run(args):
    skip("the fake accelerator is not here: plug one in")


if __name__ == "__main__":
    bench_main(parser, run)
'''

HANGS = '''
"""A fake benchmark that never ends."""
import time

from harness.bench.script import BenchParser, bench_main


def parser():
    return BenchParser()


def run(args):
    print("sleeping", flush=True)
    time.sleep(600)
    return []


if __name__ == "__main__":
    bench_main(parser, run)
'''

#: A script of the old kind: prints its figures, has no parser() or run(args).
NO_CONTRACT = '''
"""An old-style benchmark."""


def main():
    print("figure 1.0 target <= 2.0")


if __name__ == "__main__":
    main()
'''


def write(folder: Path, **modules: str) -> Path:
    """``bench_NAME.py`` for each NAME=source in ``folder`` (made); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (folder / f"bench_{name}.py").write_text(textwrap.dedent(source).lstrip())
    return folder
