"""``schedscope baseline update``: write a run's per-request rows and identity as a
baseline file for ``schedscope gate`` (docs/gate.md, "Baselines")."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.text import Text

from harness.cli.app import console, err_console
from harness.cli.gate import ALLOW_HELP

baseline_app = typer.Typer(
    help="Baseline files for `schedscope gate`.", no_args_is_help=True, add_completion=False
)


@baseline_app.command("update")
def update(
    source: Path = typer.Option(
        ..., "--from", help="The run directory (schedscope run or simulate output)."
    ),
    out: Path = typer.Option(..., "--out", help="The baseline file to write (JSON)."),
    allow_mismatch: list[str] = typer.Option([], "--allow-mismatch", help=ALLOW_HELP),
) -> None:
    """Write (or replace) a baseline. Replacing one made from another profile, seed,
    schedule, schema version or machine is refused unless --allow-mismatch names it."""
    from harness.gate.baseline import check_compatible, write_baseline
    from harness.gate.evaluate import check_usable
    from harness.gate.gate import USAGE, open_side
    from harness.gate.sides import GateInputError

    try:
        if not source.is_dir():
            raise GateInputError(f"--from {source}: expected a run directory")
        side = open_side(source, "new baseline")
        check_usable(side, "new baseline")
        planted = sorted(n for n, c in side.cells.items() if c.faults)
        if planted:
            raise GateInputError(
                f"--from {source}: cell {planted[0]} ran with planted faults "
                "(SCHEDSCOPE_FAULT); a baseline must come from an unmodified engine"
            )
        notes: list[str] = []
        if out.exists():
            notes = check_compatible(open_side(out, "old baseline"), side, set(allow_mismatch))
        body = write_baseline(side, out)
    except GateInputError as exc:
        err_console.print(Text.assemble(("baseline: error:", "red"), f" {exc}"), soft_wrap=True)
        raise typer.Exit(USAGE) from None
    for note in notes:
        console.print(note, markup=False)
    cells = ", ".join(f"{n} ({len(c['rows'])} requests)" for n, c in body["cells"].items())
    console.print(f"baseline: {out} ({body['mode']}): {cells}", markup=False, soft_wrap=True)
