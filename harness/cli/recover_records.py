"""``schedscope recover-records``: the record files of a server that was killed, merged
from the parts it wrote as it ran (harness/incremental_records.py; docs/serving.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import console, err_console


def recover_records(
    files: list[Path] = typer.Argument(
        ...,
        metavar="FILE...",
        help="Record files as given to serve's --record-steps/--record-requests/"
        "--record-decisions; FILE.parts/ must be beside each.",
    ),
) -> None:
    """Merge the parts a killed `schedscope serve` left beside each record file
    (FILE.parts/) into FILE: every row up to the server's last flush. Exit 1 when a file
    has no parts or cannot be written."""
    from harness.incremental_records import parts_dir, recover_record_file

    failed = 0
    for path in files:
        try:
            num_rows = recover_record_file(path)
        except Exception as exc:
            err_console.print(f"{path}: could not recover: {exc}")
            failed += 1
            continue
        if num_rows is None:
            err_console.print(f"{path}: nothing to recover ({parts_dir(path)} does not exist)")
            failed += 1
        else:
            console.print(f"{path}: {num_rows} rows recovered")
    if failed:
        raise typer.Exit(1)
