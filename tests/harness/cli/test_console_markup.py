"""The consoles never read markup in what they print.

Names, paths and messages from outside reach the console: a target's error text, a
``--label`` (a cell's name), a baseline's identity, a file name. Rich consoles read
``[/x]`` as a closing tag (``MarkupError``, a traceback, exit 1: the gate's code for a
regression) and ``[red]`` as a style, so every Console the harness makes has markup off
and colours are given as styles. Each path that used to fail prints ``[/x]`` here.
"""

from __future__ import annotations

import ast
import importlib
import io
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console
from typer.testing import CliRunner

from harness.cli import app
from harness.report.errors import error_summary
from harness.run.cell_result import CellResult
from harness.run.live import RecordsTail, figures_line
from harness.run.matrix import Cell
from harness.run.runner import Progress, _print_cell, _print_errors, summary_table
from tests.support.paths import REPO

EVIL = "[/x] [red]boom[/red] [bold"
#: the module of the consoles (``harness.cli.app`` is the Typer app the package exports)
app_module = importlib.import_module("harness.cli.app")


def console_calls(source: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "Console"
    ]


def test_every_console_the_harness_makes_has_markup_off():
    """In the source: every ``Console(...)`` says ``markup=False``, and nothing turns
    markup back on (``markup=True``, ``Text.from_markup``)."""
    found, wrong = 0, []
    for path in sorted((REPO / "harness").rglob("*.py")):
        source = path.read_text()
        for call in console_calls(source):
            found += 1
            markup = [k for k in call.keywords if k.arg == "markup"]
            if not (markup and isinstance(markup[0].value, ast.Constant)):
                wrong.append(f"{path.relative_to(REPO)}:{call.lineno}")
            elif markup[0].value.value is not False:
                wrong.append(f"{path.relative_to(REPO)}:{call.lineno}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.keyword) and node.arg == "markup":
                if isinstance(node.value, ast.Constant) and node.value.value is True:
                    wrong.append(f"{path.relative_to(REPO)}: markup=True")
            if isinstance(node, ast.Attribute) and node.attr == "from_markup":
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: from_markup")
    assert found >= 6 and not wrong, wrong


IMPORT_ALL = """
import importlib, pkgutil, re, sys
from pathlib import Path
from rich.console import Console
import harness
app = importlib.import_module("harness.cli.app")  # harness.cli.app is the Typer app

# Locust's modules monkey-patch the process when imported: they print through Locust's
# logging, not a Console, and are left out, as is every module that imports one of them
# (at its top: the Locust file's parts import each other).
LOCUST = re.compile(r"^\\s*(import locust|from locust)", re.M)
IMPORTS = re.compile(r"^(?:from (harness[\\w.]*) import|import (harness[\\w.]*))", re.M)
sources = {
    m.name: Path(importlib.util.find_spec(m.name).origin).read_text()
    for m in pkgutil.walk_packages(harness.__path__, "harness.")
}
patching = {name for name, source in sources.items() if LOCUST.search(source)}
while True:
    more = {
        name
        for name, source in sources.items()
        if name not in patching
        and any((a or b) in patching for a, b in IMPORTS.findall(source))
    }
    if not more:
        break
    patching |= more
consoles = []
for name in sources:
    if name.endswith("__main__") or name in patching:
        continue
    loaded = importlib.import_module(name)
    consoles += [v for v in vars(loaded).values() if isinstance(v, Console)]
assert app.console in consoles and app.err_console in consoles, "the app's consoles"
print(len(consoles), [c._markup for c in consoles])
"""


def test_the_consoles_of_every_harness_module_have_markup_off():
    """Every harness module imported (in a fresh interpreter): each Console it holds."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    count, markups = proc.stdout.split(" ", 1)
    assert int(count) >= 2 and ast.literal_eval(markups) == [False] * int(count)


@pytest.fixture
def printed(monkeypatch):
    """What the app's consoles print, as text."""
    out, err = io.StringIO(), io.StringIO()
    # Rich's ``file`` property reads sys.stdout when no file was given: patching it
    # would restore that moment's stream for good (later CliRunner tests then captured
    # nothing), so the console's own ``_file`` (None: follow sys.stdout) is patched.
    monkeypatch.setattr(app_module.console, "_file", out)
    monkeypatch.setattr(app_module.err_console, "_file", err)
    return out, err


def evil_path(tmp_path: Path) -> Path:
    return tmp_path / "a[" / "x] [red]y"  # its text holds "[/x]"


def test_report_of_a_path_with_markup_is_a_usage_error_not_a_traceback(tmp_path):
    path = evil_path(tmp_path)
    result = CliRunner().invoke(app, ["report", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "error:" in result.output and "[/x]" in result.output


def test_gate_errors_naming_markup_exit_2(tmp_path):
    path = evil_path(tmp_path)
    result = CliRunner().invoke(app, ["gate", "--baseline", str(path), "--current", str(path)])
    assert result.exit_code == 2, result.output
    assert "gate: error:" in result.output and "[/x]" in result.output


def test_the_gate_s_internal_error_naming_markup_exits_2(tmp_path, monkeypatch):
    import harness.gate.gate as gate

    def broken(*args, **kwargs):
        raise KeyError("cell [/x] [red]r1[/red]")

    monkeypatch.setattr(gate, "run_gate", broken)
    path = evil_path(tmp_path)
    result = CliRunner().invoke(app, ["gate", "--baseline", str(path), "--current", str(path)])
    assert result.exit_code == 2, result.output
    assert "gate: internal error (KeyError: 'cell [/x] [red]r1[/red]')" in result.output


def test_recover_records_of_a_path_with_markup_says_so(tmp_path):
    path = evil_path(tmp_path) / "requests.parquet"
    result = CliRunner().invoke(app, ["recover-records", str(path)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"{path}: nothing to recover" in result.output.replace("\n", "")


def test_a_run_s_console_lines_print_markup_literally(printed, tmp_path):
    """A cell named like markup (a --label), failing with a target's message like it."""
    out, _ = printed
    console = app_module.console
    cell = Cell(EVIL, "fcfs", None, 1.0, {})
    result = CellResult(cell, tmp_path, "target", counts={"ok": 1, "error": 3}, scheduled=4)
    result.fail("error_rate", f"75% of requests failed; the commonest: {EVIL}")
    result.warnings.append(f"warned {EVIL}")
    result.errors = error_summary(
        pl.DataFrame(
            {
                "status": ["ok", "error", "error", "error"],
                "error": [None, EVIL, EVIL, EVIL],
                "http_status": [200, 500, 500, 500],
            }
        )
    )
    _print_cell(console, result)
    _print_errors(console, [result], [result], 0.05)
    console.print(summary_table(tmp_path / "[/x]", [result], None))
    with Progress(console) as progress:
        progress.show(figures_line(EVIL, 0.0, RecordsTail(tmp_path), 4, {}))
        progress.show(f"{EVIL}: starting")
    text = out.getvalue()
    assert f"{EVIL}: degraded" in text
    assert f"error_rate: 75% of requests failed; the commonest: {EVIL}" in text
    assert f"warning: warned {EVIL}" in text and f"{EVIL}: starting" in text
    assert "error rate over --max-error-rate 0.05: " in text
    assert f"{EVIL}  " in text  # the live figures' line, the cell's name first


def test_styles_still_colour_a_terminal():
    """Markup off, the colours stay: the styles are Text's, not markup's."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard", markup=False)
    cell = Cell("fcfs", "fcfs", None, 1.0, {})
    _print_cell(console, CellResult(cell, Path("."), "target", counts={"ok": 1}, scheduled=1))
    assert "\x1b[32mok\x1b[0m" in out.getvalue()
