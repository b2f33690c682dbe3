"""Live figures while a cell runs, from the client records being written
(``client-*.jsonl``, one row per request as it ends) and the scraper's latest gauges:
elapsed, requests done / scheduled, errors, TTFT p95 of the last 200 finished requests,
queue depth (``vllm:num_requests_waiting``) and running requests.

The line is a styled ``rich.text.Text``, not markup: the consoles read none (a cell's
name is the user's ``--label``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.text import Text

from harness.records.percentiles import percentile

RECENT = 200


class RecordsTail:
    """Reads the new lines of every ``client-*.jsonl`` in a directory."""

    def __init__(self, records_dir: Path) -> None:
        self.dir = records_dir
        self.offsets: dict[Path, int] = {}
        self.done = 0
        self.errors = 0
        self.by_status: dict[str, int] = {}
        self.recent_ttft: list[float] = []

    def poll(self) -> None:
        for path in sorted(self.dir.glob("client-*.jsonl")):
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # a half-written last line waits for the next poll
            self.offsets[path] = offset + end
            for line in chunk[:end].splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                self.done += 1
                status = row.get("status") or "?"
                self.by_status[status] = self.by_status.get(status, 0) + 1
                if status != "ok":
                    self.errors += 1
                elif row.get("ttft_s") is not None:
                    self.recent_ttft.append(float(row["ttft_s"]))
        if len(self.recent_ttft) > RECENT:
            self.recent_ttft = self.recent_ttft[-RECENT:]

    @property
    def ttft_p95(self) -> float | None:
        return percentile(self.recent_ttft, 95)


def figures_line(
    cell: str, started: float, tail: RecordsTail, scheduled: int | None, latest: dict[str, float]
) -> Text:
    """The live figures: the cell's name in bold, the errors in red when there are any."""
    p95 = tail.ttft_p95
    waiting = latest.get("vllm:num_requests_waiting")
    running = latest.get("vllm:num_requests_running")
    parts: list[str | tuple[str, str]] = [
        (cell, "bold"),
        f"{time.monotonic() - started:5.0f} s",
        f"done {tail.done}/{scheduled if scheduled is not None else '?'}",
        f"TTFT p95 {p95 * 1000:.0f} ms" if p95 is not None else "TTFT p95 -",
        f"waiting {waiting:.0f}" if waiting is not None else "waiting -",
        f"running {running:.0f}" if running is not None else "running -",
        (f"errors {tail.errors}", "red") if tail.errors else "errors 0",
    ]
    return Text("  ").join(Text.assemble(part) for part in parts)
