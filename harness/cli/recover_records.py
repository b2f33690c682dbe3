"""``schedscope recover-records``: the record files of a server that was killed, merged
from the parts it wrote as it ran (harness/records/incremental.py; docs/serving.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import console, err_console


def recovery_line(path: Path) -> tuple[bool, str]:
    """(recovered, what to say) for one record file. Plain text: the paths are the user's
    and may hold anything, brackets included."""
    from harness.records.incremental import RecordMergeError, parts_dir, recover

    try:
        merged = recover(path)
    except RecordMergeError as exc:
        return False, (
            f"{path}: could not recover: {exc}; nothing was changed (move that file out of "
            f"{parts_dir(path)} to recover the other parts)"
        )
    except OSError as exc:
        return False, (
            f"{path}: could not recover: cannot write it ({exc.strerror or exc}); nothing "
            "was changed"
        )
    if merged is None:
        folder = parts_dir(path)
        why = "holds no part" if folder.is_dir() else "does not exist"
        return False, f"{path}: nothing to recover ({folder} {why})"
    line = f"{path}: {merged.num_rows} rows recovered from {merged.num_parts} part(s)"
    if merged.replaced:
        line += " (replaced the file that was there, as the server's shutdown would have)"
    if merged.kept:
        line += (
            f"; {parts_dir(path)} kept: it holds files that are not the server's parts: "
            + ", ".join(p.name for p in merged.kept)
        )
    return True, line


def recover_records(
    files: list[Path] = typer.Argument(
        ...,
        metavar="FILE...",
        help="Record files as given to serve's --record-steps/--record-requests/"
        "--record-decisions; FILE.parts/ must be beside each.",
    ),
) -> None:
    """Merge the parts a killed `schedscope serve` left beside each record file
    (FILE.parts/) into FILE: every row up to the server's last flush. FILE is replaced
    only by a whole merge; exit 1 when a file has no parts or cannot be recovered (it is
    then left as it was, with its parts)."""
    failed = 0
    for path in files:
        recovered, line = recovery_line(path)
        if recovered:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            err_console.print(line, markup=False, highlight=False, soft_wrap=True)
            failed += 1
    if failed:
        raise typer.Exit(1)
