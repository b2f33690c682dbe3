"""Disjoint CPU cores for the served engine and the load generator.

On a small machine the load generator's CPU use lands in the engine's steps: on 2 cores
the same steps took 14-22% longer beside Locust than beside a light asyncio client. A
cost model fitted from such steps prices the engine *and its neighbour*, and a gate
comparing two runs compares how busy the neighbour was. So when ``schedscope run`` or
``schedscope calibrate`` starts ``schedscope serve`` itself, on a machine with at least
two cores, the server and the load generator are pinned to disjoint sets of cores (Linux
CPU affinity, ``sched_setaffinity``): the server gets the first half of the cores this
process may use (rounded up), the load generator (Locust, its worker processes and what
they start) the rest.

``--cpu-split`` overrides it: ``auto`` (the default, as above), ``off`` (nothing pinned:
every process may run anywhere, as before), or ``SERVE:LOAD`` with two lists of CPU ids
(``0:1``, ``0-5:6,7``). The split a cell ran with is recorded in its run.json
(``cpu_split``), and it is part of the cost model's machine fingerprint: steps served on
one core are not steps served on two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
OFF = "off"
GIVEN = "given"  # a split spelt SERVE:LOAD


class CpuSplitError(ValueError):
    """A ``--cpu-split`` value that cannot be used; the message says why."""


@dataclass(frozen=True)
class CpuSplit:
    """The cores of the served engine and of the load generator (disjoint)."""

    serve: tuple[int, ...]
    load_generator: tuple[int, ...]
    #: "auto" (chosen from the cores this process may use) or "given" (--cpu-split)
    chosen: str = AUTO

    def to_dict(self) -> dict:
        return {
            "serve": list(self.serve),
            "load_generator": list(self.load_generator),
            "chosen": self.chosen,
        }

    def line(self) -> str:
        return (
            f"CPU split ({self.chosen}): schedscope serve on CPU {_ranges(self.serve)}, "
            f"the load generator on CPU {_ranges(self.load_generator)}"
        )


def available_cpus() -> tuple[int, ...]:
    """The CPU ids this process may run on (all of ``os.cpu_count()`` where the platform
    has no affinity)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


def auto_split(cpus: tuple[int, ...] | None = None) -> CpuSplit | None:
    """The default split of ``cpus`` (default :func:`available_cpus`): the first half,
    rounded up, to the server, the rest to the load generator; None with fewer than two
    cores (nothing to split) or where this platform cannot pin a process."""
    cpus = available_cpus() if cpus is None else tuple(sorted(cpus))
    if len(cpus) < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    half = len(cpus) - len(cpus) // 2
    return CpuSplit(cpus[:half], cpus[half:], AUTO)


def parse_cpu_split(text: str, cpus: tuple[int, ...] | None = None) -> CpuSplit | None:
    """``auto``, ``off`` or ``SERVE:LOAD`` (see the module) as a split of ``cpus``
    (default :func:`available_cpus`); None for ``off`` (and for ``auto`` where there is
    nothing to split). Raises :class:`CpuSplitError` naming the problem: a malformed
    list, a side with no CPU, a CPU on both sides, a CPU this process may not use."""
    text = text.strip()
    if text == OFF:
        return None
    if text == AUTO:
        return auto_split(cpus)
    if not hasattr(os, "sched_setaffinity"):
        raise CpuSplitError(f"{text!r}: this platform cannot pin processes to CPUs; use 'off'")
    serve_text, sep, load_text = text.partition(":")
    if not sep:
        raise CpuSplitError(f"{text!r}: expected auto, off or SERVE:LOAD (e.g. 0:1, 0-5:6,7)")
    serve, load = _cpu_list(serve_text, "SERVE"), _cpu_list(load_text, "LOAD")
    both = sorted(set(serve) & set(load))
    if both:
        raise CpuSplitError(f"{text!r}: CPU {_ranges(tuple(both))} on both sides")
    allowed = set(available_cpus() if cpus is None else cpus)
    outside = sorted((set(serve) | set(load)) - allowed)
    if outside:
        raise CpuSplitError(
            f"{text!r}: CPU {_ranges(tuple(outside))} not available to this process "
            f"(it may use {_ranges(tuple(sorted(allowed)))})"
        )
    return CpuSplit(serve, load, GIVEN)


def split_of(cores: int, cpus: tuple[int, ...] | None = None) -> CpuSplit | None:
    """The split giving the server the first ``cores`` of ``cpus`` (default
    :func:`available_cpus`) and the load generator the rest: the split a fingerprint's
    ``serve_cores`` stands for. None for 0 (not pinned) or when no core would be left."""
    cpus = available_cpus() if cpus is None else tuple(sorted(cpus))
    if cores <= 0 or cores >= len(cpus) or not hasattr(os, "sched_setaffinity"):
        return None
    return CpuSplit(cpus[:cores], cpus[cores:], AUTO)


def load_generator_cores(split: CpuSplit | None, against_target: bool) -> tuple[int, ...] | None:
    """The cores a cell's load generator is pinned to (None: not pinned). Beside a server
    the run starts, the split's load side. Against a ``--target``, only a split given as
    ``SERVE:LOAD``: the target is not ours to pin (its SERVE side says where the user runs
    it), and the automatic split would take half the cores from a generator whose target
    may be on another machine."""
    if split is None or (against_target and split.chosen != GIVEN):
        return None
    return split.load_generator


def target_split_line(split: CpuSplit) -> str:
    """What a given split means against a ``--target`` (see :func:`load_generator_cores`)."""
    return (
        f"CPU split ({split.chosen}): the load generator on CPU {_ranges(split.load_generator)}; "
        f"the target is not pinned by schedscope: start it on CPU {_ranges(split.serve)} "
        f"yourself (e.g. `taskset -c {_ranges(split.serve)} vllm serve ...`)"
    )


def serve_cores(split: CpuSplit | None) -> int:
    """The cores the server is pinned to; 0 when it is not pinned."""
    return len(split.serve) if split is not None else 0


def pin(pid: int, cpus: tuple[int, ...]) -> None:
    """Pin process ``pid`` and every thread it has now to ``cpus``; the threads and
    processes it starts later inherit it. Call it right after the process starts."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        tids = [int(t.name) for t in tasks.iterdir()]
    except OSError:  # no /proc: the process's main thread is all we can reach
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


def _cpu_list(text: str, side: str) -> tuple[int, ...]:
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise CpuSplitError(
                f"{side} {text!r}: {part!r} is not a CPU id or a range a-b"
            ) from None
        if first < 0 or last < first:
            raise CpuSplitError(f"{side} {text!r}: {part!r} is not a range of CPU ids")
        ids.update(range(first, last + 1))
    if not ids:
        raise CpuSplitError(f"{side} names no CPU")
    return tuple(sorted(ids))


def _ranges(cpus: tuple[int, ...]) -> str:
    """0,1,2,5 -> "0-2,5"."""
    out: list[str] = []
    for cpu in cpus:
        if out and "-" not in out[-1] and int(out[-1]) == cpu - 1:
            out[-1] = f"{out[-1]}-{cpu}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == cpu - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)
