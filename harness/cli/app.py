"""The ``schedscope`` Typer app: its root callback (``--version``) and the consoles the
commands print to. The commands live one per module in this package; ``harness.cli``
registers them on :data:`app`.

The consoles never read markup: what they print carries names, paths and messages from
outside (a target's error text, a ``--label``, a baseline's machine, a file name), and
Rich would take ``[/x]`` in them for a closing tag (``MarkupError``) or ``[red]`` for a
style. Colour is given as styles instead: ``Text.assemble(("error:", "red"), " ", msg)``
or ``style=`` (every Console of the harness is made with ``markup=False``; a test holds
the source to it).
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
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)


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
