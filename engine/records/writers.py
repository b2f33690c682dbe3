"""Record writers: observers that keep what they see and write it to a file when the
engine stops (the step, request and decision records of ``schedscope serve
--record-*``).

The engine does not know what the files hold: whoever starts it passes
:class:`RecordWriterSpec` entries (a factory, a path), as vLLM passes its stat loggers
in. In the engine-core process the factory runs there, so it must be picklable — a
module-level function or class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.config import EngineConfig
from engine.records.observers import ObserverList
from engine.records.step_record import StepRecord

log = logging.getLogger("schedscope.engine")


class RecordWriter(Protocol):
    def __call__(self, record: StepRecord) -> None: ...

    def write(self, path: Path) -> None: ...


@dataclass(frozen=True)
class RecordWriterSpec:
    """``make(config)`` builds the writer where the engine runs; at shutdown it writes
    to ``path``. ``name`` names it in the log."""

    make: Callable[[EngineConfig], RecordWriter]
    path: Path
    name: str


@dataclass
class InstalledWriter:
    spec: RecordWriterSpec
    writer: RecordWriter


def install_record_writers(
    observers: ObserverList, config: EngineConfig, specs: tuple[RecordWriterSpec, ...]
) -> list[InstalledWriter]:
    """Build each writer for the engine's ``config`` and add it to its ``observers``."""
    installed = []
    for spec in specs:
        writer = spec.make(config)
        observers.add(writer)
        installed.append(InstalledWriter(spec, writer))
    return installed


@dataclass(frozen=True)
class LostRecord:
    """A record file that could not be written: which, where, and why (picklable: the
    engine process reports it to the API process)."""

    name: str
    path: str
    error: str

    def describe(self) -> str:
        return f"{self.name} to {self.path}: {self.error}"


def write_records(installed: list[InstalledWriter]) -> list[LostRecord]:
    """Write every writer's file; returns the ones that could not be written (empty:
    all were). Each fails alone: one that raises (a full disk, a path gone) is logged
    with its error, and the others still write."""
    lost = []
    for item in installed:
        path = item.spec.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            item.writer.write(path)
        except Exception as exc:
            error = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
            # One line naming the file and the error (the traceback only at debug level:
            # a full disk is not a bug).
            log.error("could not write %s to %s: %s", item.spec.name, path, error)
            log.debug("writing %s to %s failed", item.spec.name, path, exc_info=True)
            lost.append(LostRecord(item.spec.name, str(path), error))
        else:
            log.info("%s: %s", item.spec.name, path)
    return lost
