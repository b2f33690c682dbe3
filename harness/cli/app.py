"""The ``schedscope`` Typer app: its root callback (``--version``) and the consoles the
commands print to. The commands live one per module in this package; ``harness.cli``
registers them on :data:`app`.
"""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="schedscope",
    help="Observability-first benchmark and load-testing harness for LLM inference schedulers.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"schedscope {version('schedscope')}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """schedscope: see *why* requests were slow — per request, per decision."""
