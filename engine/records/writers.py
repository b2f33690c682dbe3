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


def write_records(installed: list[InstalledWriter]) -> None:
    """Write every writer's file. One that fails is logged; the others still write."""
    for item in installed:
        path = item.spec.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            item.writer.write(path)
        except Exception:
            log.exception("could not write %s to %s", item.spec.name, path)
        else:
            log.info("%s: %s", item.spec.name, path)
