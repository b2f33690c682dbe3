"""Record files written as the engine runs, so a crash keeps what was recorded.

``schedscope serve --record-steps/--record-requests/--record-decisions FILE`` used to
keep every row in memory until a clean shutdown: a killed engine lost them all, and a
long run's memory grew with every request. Here a record file is written in *parts*:

- every :data:`FLUSH_INTERVAL_S` a background thread takes the rows held since the
  last flush and writes them as one whole Parquet file, ``FILE.parts/part-NNNNNN.parquet``
  (written under a temporary name and renamed, so a part is there whole or not at all);
- at shutdown the last rows become the last part, and the parts are merged, in order,
  into ``FILE`` (streamed: the merge holds one part at a time), and the folder removed.

So memory holds at most one interval's rows, and after a crash ``FILE.parts/`` holds
every row up to the last flush: ``schedscope recover-records FILE`` (or
``schedscope serve`` itself, when its engine process dies) merges them into ``FILE``;
``polars.read_parquet("FILE.parts/")`` reads them as they are. A part that cannot be
written (a full disk) is kept in memory and tried again at the next flush; only what
still cannot be written at shutdown is lost, and reported.

A merge never destroys what it cannot replace: it is written to a temporary file beside
``FILE`` and renamed over it only when whole, so a failure (a part that does not read,
parts of other columns, a full disk) leaves ``FILE`` and every part as they were. Only
the server's own files are removed afterwards — the parts merged, and the temporaries
of a write the crash cut short (:data:`PART_NAME`, :data:`PART_TEMPORARY`) — and the
folder only once it is empty: a file of anyone else's in ``FILE.parts/`` stays.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import polars as pl

from engine.records.step_record import StepRecord
from harness.records.polars_types import Schema
from harness.records.requests import write_parquet

log = logging.getLogger("schedscope.records")

#: How often held rows are written out as a part: the most a crash can lose, in seconds
#: of records, and what bounds the memory rows take (one interval's worth).
FLUSH_INTERVAL_S = 2.0

#: A part as the writer names it (``part-000001.parquet``; more digits past 999,999), and
#: the temporary it is written under before the rename: nothing else in ``FILE.parts/``
#: is the server's, so nothing else is merged or removed.
PART_NAME = re.compile(r"^part-(?P<number>\d{6,})\.parquet$")
PART_TEMPORARY = re.compile(r"^\.part-\d{6,}\.parquet\.tmp$")


class RecordMergeError(RuntimeError):
    """The parts of a record file cannot be merged; nothing was changed."""


class RowCollector(Protocol):
    """An observer of step records that can hand over what it has collected."""

    def __call__(self, record: StepRecord) -> None: ...

    def take_frame(self) -> pl.DataFrame:
        """The rows collected since the last call, as a frame; forgets them."""
        ...


def parts_dir(path: Path) -> Path:
    """Where the parts of record file ``path`` are written while the engine runs."""
    return path.with_name(path.name + ".parts")


def part_name(number: int) -> str:
    """The name of the ``number``-th part (1-based)."""
    return f"part-{number:06d}.parquet"


def part_paths(path: Path) -> list[Path]:
    """The parts of ``path`` written so far, in the order they were written (by number:
    ``part-1000000`` follows ``part-999999``)."""
    folder = parts_dir(path)
    if not folder.is_dir():
        return []
    found = [
        (int(match["number"]), p)
        for p in folder.iterdir()
        if (match := PART_NAME.match(p.name)) and p.is_file()
    ]
    return [p for _, p in sorted(found)]


def _check_parts(parts: list[Path]) -> None:
    """Every part readable, all of one schema, before anything is written: the error
    names the part (a merge would fail on it half-way, or mix columns)."""
    first = None
    for part in parts:
        try:
            schema = pl.scan_parquet(part, glob=False).collect_schema()
        except Exception as exc:  # polars raises several kinds for a file that is not Parquet
            text = str(exc).strip().splitlines()
            raise RecordMergeError(
                f"{part} is not a readable Parquet file ({text[0] if text else type(exc).__name__})"
            ) from None
        if first is None:
            first = (part, schema)
        elif schema != first[1]:
            raise RecordMergeError(
                f"{part} has other columns than {first[0].name} "
                f"({', '.join(schema.names())} against {', '.join(first[1].names())})"
            )


def _remove_server_files(path: Path, merged: list[Path]) -> list[Path]:
    """Remove the parts merged and the server's temporaries; remove ``FILE.parts/`` when
    that empties it. Returns the files left there (none of them the server's)."""
    folder = parts_dir(path)
    for part in merged:
        part.unlink(missing_ok=True)
    kept = []
    for other in sorted(folder.iterdir()) if folder.is_dir() else []:
        if PART_TEMPORARY.match(other.name) and other.is_file():
            # A write cut by the crash: never renamed, so never a whole part.
            other.unlink(missing_ok=True)
        else:
            kept.append(other)
    if not kept:
        try:
            folder.rmdir()
        except OSError:  # something appeared, or no permission: the folder stays
            kept = sorted(folder.iterdir()) if folder.is_dir() else []
    return kept


@dataclass
class Merged:
    """What a merge did: rows written to the record file, from how many parts, whether
    it replaced a file that was there, and what it left in ``FILE.parts/``."""

    num_rows: int
    num_parts: int
    replaced: bool = False
    kept: list[Path] = field(default_factory=list)


def merge(path: Path, schema: Schema | None = None) -> Merged:
    """Merge the parts of ``path`` into ``path`` (in order; an empty file of ``schema``
    when there are none) through a temporary file renamed over ``path``, then remove the
    server's files (module docstring). Raises :class:`RecordMergeError` (a part that
    cannot be merged) or ``OSError`` (``path`` cannot be written) and changes nothing."""
    parts = part_paths(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_parts(parts)
    target = path.resolve()  # through a link: the link stays, its file is replaced
    replaced = target.is_file()
    if target.exists() and not replaced:
        # Not a regular file (a device, a pipe): nothing to rename over; written in place.
        num_rows = _write_merged(parts, schema, target)
    else:
        # In the same directory, so the rename is atomic: the file is the old one or the
        # whole new one, never half of either.
        temporary = target.with_name(f".{target.name}.merging")
        try:
            num_rows = _write_merged(parts, schema, temporary)
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    return Merged(num_rows, len(parts), replaced, _remove_server_files(path, parts))


def _write_merged(parts: list[Path], schema: Schema | None, out: Path) -> int:
    """``parts`` concatenated into ``out`` (streamed: one part in memory at a time), or
    an empty file of ``schema`` when there are none; the number of rows."""
    if not parts:
        write_parquet(pl.DataFrame(schema=schema or {}), out)
        return 0
    pl.scan_parquet(parts, glob=False).sink_parquet(out, compression="zstd", statistics=False)
    return sum(pl.scan_parquet(p, glob=False).select(pl.len()).collect().item() for p in parts)


def merge_parts(path: Path, schema: Schema | None = None) -> int:
    """:func:`merge`, returning the number of rows."""
    return merge(path, schema).num_rows


def recover(path: Path) -> Merged | None:
    """After a crash: merge the parts a run left of ``path`` into ``path`` (:func:`merge`).
    None when there is nothing to recover (no ``FILE.parts/``, or no part in it): then
    nothing is written, so a failed recovery never leaves a 0-row ``path``."""
    if not part_paths(path):
        return None
    return merge(path)


def recover_record_file(path: Path) -> int | None:
    """:func:`recover`, returning the number of rows recovered (None: nothing to recover)."""
    merged = recover(path)
    return None if merged is None else merged.num_rows


class IncrementalRecordWriter:
    """Observer that passes each step record to ``collector`` and writes what it collected
    to ``path``'s parts every ``flush_interval_s`` (a thread of its own, so rows are
    written while the engine is idle too), then merges them at :meth:`write`.

    The lock is held only while the collector records a step or hands its rows over
    (no file I/O under it): the engine's thread waits for a flush at most as long as a
    frame of one interval's rows takes to build.
    """

    def __init__(
        self,
        collector: RowCollector,
        path: Path,
        schema: Schema,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.collector = collector
        self.path = Path(path)
        self.schema = schema
        self.flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._pending: list[pl.DataFrame] = []  # taken, not yet written (a failed write)
        self._num_parts = len(part_paths(self.path))
        self.num_rows_written = 0
        self.num_failed_flushes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._flush_periodically, name=f"records:{self.path.name}", daemon=True
        )
        self._thread.start()

    def __call__(self, record: StepRecord) -> None:
        with self._lock:
            self.collector(record)

    def flush(self) -> None:
        """Write the rows collected so far as a part (with any that failed before).
        Raises when the part cannot be written; the rows are then kept for the next try."""
        with self._lock:
            frame = self.collector.take_frame()
        if frame.height:
            self._pending.append(frame)
        if not self._pending:
            return
        frame = pl.concat(self._pending) if len(self._pending) > 1 else self._pending[0]
        folder = parts_dir(self.path)
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / part_name(self._num_parts + 1)
        temporary = part.with_name("." + part.name + ".tmp")  # PART_TEMPORARY
        try:
            write_parquet(frame, temporary)
            os.replace(temporary, part)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self._pending.clear()
        self._num_parts += 1
        self.num_rows_written += frame.height

    def _flush_periodically(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except Exception as exc:
                self.num_failed_flushes += 1
                if self.num_failed_flushes == 1 or self.num_failed_flushes % 100 == 0:
                    log.error(
                        "could not write records to %s (%d failed flushes; the rows are "
                        "kept and tried again): %s",
                        parts_dir(self.path),
                        self.num_failed_flushes,
                        exc,
                    )

    def write(self, path: Path) -> None:
        """At shutdown: the last rows as the last part, then every part merged into the
        record file. Raises when either cannot be written (the parts already written stay
        on disk, for ``schedscope recover-records``)."""
        self._stop.set()
        self._thread.join()
        self.flush()
        if Path(path) != self.path:
            raise ValueError(f"this writer writes {self.path}, not {path}")
        merge_parts(self.path, self.schema)
