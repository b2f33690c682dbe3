"""The benchmark side of the contract (docs/benchmarks.md, "The contract"): each
``benchmarks/bench_NAME.py`` defines

- ``parser() -> BenchParser``: its options; sizes that ``--quick`` shrinks are
  declared with :meth:`BenchParser.sized` (their full and quick values);
- ``run(args) -> list[Figure]``: measures, prints its own lines (each figure beside
  its target) and returns the figures;
- ``if __name__ == "__main__": bench_main(parser, run)``.

So ``python benchmarks/bench_NAME.py [--quick] [--json FILE]`` runs it alone, and
``python -m benchmarks`` (:mod:`harness.bench.runner`) runs it in a subprocess and
reads the figures from ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from harness.bench.figure import Figure, FigureError

#: The exit status of a benchmark that cannot run on this machine (a component it needs
#: is absent): the suite reports it as skipped, with the reason it printed, and goes on.
#: 77 is the status that automake's test harness and others read as "skipped".
SKIPPED_EXIT = 77

#: Set by ``python -m benchmarks --device``: the default of every ``--device`` option
#: (:meth:`BenchParser.add_device`); benchmarks without one ignore it.
DEVICE_ENV = "SCHEDSCOPE_BENCH_DEVICE"
DEVICES = ("cpu", "cuda")


class BenchParser(argparse.ArgumentParser):
    """An argument parser with ``--quick`` and ``--json FILE``, and options whose
    default depends on ``--quick`` (:meth:`sized`)."""

    def __init__(self, description: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, **kwargs)
        self._sizes: dict[str, tuple[object, object]] = {}
        self.add_argument(
            "--quick",
            action="store_true",
            help="the short mode (python -m benchmarks --quick): the sizes marked '--quick:' below",
        )
        self.add_argument(
            "--json",
            type=Path,
            default=None,
            metavar="FILE",
            help="also write the figures to FILE (what python -m benchmarks reads)",
        )

    def sized(self, *flags: str, full: object, quick: object, help: str = "", **kwargs):
        """An option defaulting to ``full``, or to ``quick`` under ``--quick``; a value
        given on the command line wins either way."""
        action = self.add_argument(
            *flags,
            default=None,
            help=f"{help}{' ' if help else ''}(default {full}; --quick: {quick})",
            **kwargs,
        )
        self._sizes[action.dest] = (full, quick)
        return action

    def add_device(self) -> argparse.Action:
        """``--device cpu|cuda``: default ``$SCHEDSCOPE_BENCH_DEVICE``, else cuda when
        torch sees one, else cpu (resolved after parsing)."""
        return self.add_argument(
            "--device",
            choices=DEVICES,
            default=None,
            help=f"where the model runs (default ${DEVICE_ENV}, else cuda when available, "
            "else cpu)",
        )

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        for dest, (full, quick) in self._sizes.items():
            if getattr(parsed, dest) is None:
                setattr(parsed, dest, quick if parsed.quick else full)
        if hasattr(parsed, "device"):
            if parsed.device is None:
                parsed.device = default_device(self)
            if parsed.device == "cuda" and not cuda_available():
                self.error("--device cuda: torch sees no CUDA device here")
        return parsed


def default_device(parser: argparse.ArgumentParser | None = None) -> str:
    """``$SCHEDSCOPE_BENCH_DEVICE`` when set, else cuda when torch sees one, else cpu."""
    chosen = os.environ.get(DEVICE_ENV)
    if chosen:
        if chosen not in DEVICES:
            message = f"{DEVICE_ENV}={chosen!r}: expected one of {', '.join(DEVICES)}"
            if parser is not None:
                parser.error(message)
            raise ValueError(message)
        return chosen
    return "cuda" if cuda_available() else "cpu"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_figures(figures: object, source: str) -> list[Figure]:
    """``figures`` as a list of Figure with distinct names, or FigureError naming
    ``source``: a result is gated by (benchmark, figure name)."""
    if not isinstance(figures, list) or not all(isinstance(f, Figure) for f in figures):
        raise FigureError(f"{source}: run() must return a list of Figure, not {figures!r}")
    seen: set[str] = set()
    for figure in figures:
        if figure.name in seen:
            raise FigureError(f"{source}: two figures named {figure.name!r}")
        seen.add(figure.name)
    return figures


def figures_document(name: str, args: argparse.Namespace, figures: list[Figure]) -> dict:
    """What ``--json FILE`` holds: the benchmark, its arguments and its figures."""
    arguments = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k != "json" and (v is None or isinstance(v, str | int | float | bool | Path))
    }
    return {
        "benchmark": name,
        "quick": bool(args.quick),
        "arguments": arguments,
        "figures": [f.to_dict() for f in figures],
    }


def read_figures(path: Path) -> list[Figure]:
    """The figures a benchmark wrote with ``--json`` (FigureError if malformed)."""
    try:
        data = json.loads(path.read_text())
        return [Figure.from_dict(f) for f in data["figures"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FigureError(f"{path}: not a figures file ({exc})") from None


def skip(reason: str, say: Callable[[str], None] = print) -> NoReturn:
    """Stop the benchmark as skipped (:data:`SKIPPED_EXIT`): ``reason`` says what this
    machine lacks and how to get it; its last line is what the suite shows."""
    say(f"skipped: {reason}")
    raise SystemExit(SKIPPED_EXIT)


def bench_main(
    parser: Callable[[], BenchParser],
    run: Callable[[argparse.Namespace], list[Figure]],
    argv: Sequence[str] | None = None,
) -> list[Figure]:
    """Parse, run, check the figures, write ``--json`` when asked; returns the figures."""
    args = parser().parse_args(argv)
    name = Path(run.__code__.co_filename).stem
    figures = check_figures(run(args), name)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures_document(name, args, figures), indent=1) + "\n")
    return figures
