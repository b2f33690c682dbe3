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
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Protocol

import polars as pl

from engine.records.step_record import StepRecord
from harness.records import write_parquet

log = logging.getLogger("schedscope.records")

#: How often held rows are written out as a part: the most a crash can lose, in seconds
#: of records, and what bounds the memory rows take (one interval's worth).
FLUSH_INTERVAL_S = 2.0

PART_PATTERN = "part-*.parquet"


class RowCollector(Protocol):
    """An observer of step records that can hand over what it has collected."""

    def __call__(self, record: StepRecord) -> None: ...

    def take_frame(self) -> pl.DataFrame:
        """The rows collected since the last call, as a frame; forgets them."""
        ...


def parts_dir(path: Path) -> Path:
    """Where the parts of record file ``path`` are written while the engine runs."""
    return path.with_name(path.name + ".parts")


def part_paths(path: Path) -> list[Path]:
    """The parts of ``path`` written so far, in the order they were written."""
    folder = parts_dir(path)
    return sorted(folder.glob(PART_PATTERN)) if folder.is_dir() else []


def merge_parts(path: Path, schema: dict[str, pl.DataType] | None = None) -> int:
    """Merge the parts of ``path`` into ``path`` (in order; an empty file of ``schema``
    when there are none), then remove the parts. Returns the number of rows. Raises
    (and keeps the parts) when ``path`` cannot be written."""
    parts = part_paths(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if parts:
        scan = pl.scan_parquet(parts)
        scan.sink_parquet(path, compression="zstd", statistics=False)
        num_rows = pl.scan_parquet(path).select(pl.len()).collect().item()
    else:
        write_parquet(pl.DataFrame(schema=schema or {}), path)
        num_rows = 0
    shutil.rmtree(parts_dir(path), ignore_errors=True)
    return num_rows


def recover_record_file(path: Path) -> int | None:
    """After a crash: merge the parts a run left of ``path`` into ``path``. Returns the
    number of rows recovered, or None when ``path`` has no parts."""
    if not parts_dir(path).is_dir():
        return None
    return merge_parts(path)


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
        schema: dict[str, pl.DataType],
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
        part = folder / f"part-{self._num_parts + 1:06d}.parquet"
        temporary = part.with_name("." + part.name + ".tmp")
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
