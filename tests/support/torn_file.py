"""A file cut short, as a writer killed mid-write leaves it."""

from __future__ import annotations

from pathlib import Path


def truncate_to_half(path: Path) -> None:
    """Keep the first half of ``path``'s bytes (rounded down): for a Parquet file, no
    footer, so no reader can open it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
