"""A cell whose records cannot be used is named (stderr, report.md, report.html,
summary.json ``broken``) and left out of every table, comparison and verdict; the report
goes on with the other cells, and exits 2 only when no cell is left (docs/report.md,
"Broken cells"). Bad run info is ignored and said, never a traceback; no NumPy warning
reaches the console."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import harness.report.build as build
from harness.cli import app
from harness.report import ReportOptions, generate_report
from tests.support.gate_runs import requests_frame, write_run
from tests.support.torn_file import truncate_to_half

# wide enough that no path or message wraps inside a word (rich breaks a long word at the
# terminal's width: a temporary path is longer under pytest-xdist)
runner = CliRunner(env={"COLUMNS": "400"})
POLICIES = ("fcfs", "sjf", "priority")


def _run(tmp_path: Path, policies=POLICIES, **options) -> Path:
    cells = {p: requests_frame(seed=n + 1, n=60) for n, p in enumerate(policies)}
    return write_run(tmp_path / "run", cells, **options)


def _set(column: str, value, row: int = 3):
    def edit(path: Path) -> None:
        frame = pl.read_parquet(path)
        frame.with_columns(
            pl.when(pl.int_range(pl.len()) == row)
            .then(pl.lit(value, dtype=frame.schema[column]))
            .otherwise(pl.col(column))
            .alias(column)
        ).write_parquet(path)

    return edit


BAD_FILES = {
    "another_schema": (
        lambda p: pl.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]}).write_parquet(p),
        "no request_id, status, scheduled_at, ttft_s, e2e_s columns",
    ),
    "truncated": (truncate_to_half, "not a readable Parquet file"),
    "empty": (lambda p: p.write_bytes(b""), "not a readable Parquet file"),
    "negative_ttft": (_set("ttft_s", -5.0), "request r00003 has ttft_s -5 (1 such row)"),
    "infinite_e2e": (_set("e2e_s", math.inf), "request r00003 has e2e_s inf (1 such row)"),
    "nan_tpot": (_set("tpot_s", math.nan), "request r00003 has tpot_s NaN (1 such row)"),
    "unknown_status": (_set("status", "done"), "status that is not ok/error/rejected/aborted"),
    "text_latency": (
        lambda p: (
            pl.read_parquet(p).with_columns(pl.col("ttft_s").cast(pl.String)).write_parquet(p)
        ),
        "ttft_s is String, not a number",
    ),
}


def _report(root: Path):
    result = runner.invoke(app, ["report", str(root), "--bootstrap", "20"])
    return result, " ".join(result.output.split())


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_broken_cell_is_named_and_left_out_of_every_verdict(tmp_path, kind):
    spoil, named = BAD_FILES[kind]
    root = _run(tmp_path)
    spoil(root / "fcfs" / "requests.parquet")
    result, text = _report(root)
    assert result.exit_code == 0, result.output
    assert "broken: run/fcfs:" in text and named in text
    summary = json.loads((root / "summary.json").read_text())
    (broken,) = summary["broken"]
    assert (broken["run"], broken["policy"]) == ("run", "fcfs")
    assert any(named in p for p in broken["problems"])
    assert sorted(summary["policies"]) == ["priority", "sjf"]
    # the other cells are compared; nothing is said of the broken one
    assert summary["verdicts"]
    for verdict in summary["verdicts"].values():
        assert set(verdict["values"]) <= {"priority", "sjf"}
        assert "fcfs" not in verdict["sentence"]
    md = (root / "report.md").read_text()
    section = md.split("## Broken cells", 1)[1].split("##", 1)[0]
    assert "run/fcfs" in section
    table = md.split("## Per policy x class", 1)[1].split("##", 1)[0]
    assert "| fcfs |" not in table and "| sjf |" in table
    page = (root / "report.html").read_text()
    assert 'data-broken="cells"' in page and "run/fcfs" in page


def test_a_confident_verdict_is_never_made_against_a_cell_without_data(tmp_path):
    """The review's case: fcfs's requests.parquet replaced by another schema made 'sjf
    has the best goodput: 1.647 req/s against fcfs's 0.000 req/s, beyond noise'."""
    root = _run(tmp_path, policies=("fcfs", "sjf"))
    BAD_FILES["another_schema"][0](root / "fcfs" / "requests.parquet")
    result, text = _report(root)
    assert result.exit_code == 0, result.output
    assert "fcfs's" not in text and "against fcfs" not in text.lower()
    summary = json.loads((root / "summary.json").read_text())
    assert summary["verdicts"] == {} and summary["against_fcfs"] == []


def test_no_usable_cell_is_exit_2_naming_every_cell(tmp_path):
    root = _run(tmp_path, policies=("fcfs", "sjf"))
    truncate_to_half(root / "fcfs" / "requests.parquet")
    _set("e2e_s", -1.0)(root / "sjf" / "requests.parquet")
    result, text = _report(root)
    assert result.exit_code == 2, result.output
    assert "no cell can be used" in text
    assert "run/fcfs" in text and "run/sjf" in text and "e2e_s -1" in text


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize(
    ("summary", "said"),
    [
        ({"policies": "x"}, "policies is not an object (str): ignored"),
        ({"policies": {"fcfs": 3}}, "policies.fcfs is not an object: ignored"),
        ({"runs": [1]}, "runs is not an object (list): ignored"),
        (
            {"policies": {"fcfs": {"duration_s": -60, "config": "x"}}},
            "summary.json duration_s -60 is not a duration in seconds: computed from the rows",
        ),
        (
            {"policies": {"fcfs": {"stall_threshold_s": "fast"}}},
            "stall_threshold_s 'fast' is not a positive duration",
        ),
        ({"profile": 5, "policies": {}}, "summary.json: profile is not a string: ignored"),
    ],
)
def test_run_info_of_the_wrong_shape_is_ignored_and_said(tmp_path, summary, said):
    root = _run(tmp_path, policies=("fcfs", "sjf"))
    (root / "summary.json").write_text(json.dumps(summary))
    result, text = _report(root)
    assert result.exit_code == 0, result.output
    assert said in text
    written = json.loads((root / "summary.json").read_text())
    goodput = written["policies"]["fcfs"]["overall"]["goodput_rps"]
    assert goodput is not None and 0 < goodput < 10


def test_an_unusable_optional_file_is_left_out_and_said(tmp_path):
    root = _run(tmp_path, policies=("fcfs", "sjf"))
    (root / "fcfs" / "steps.parquet").write_bytes(b"PAR1 not really")
    pl.DataFrame({"name": ["x"]}).write_parquet(root / "fcfs" / "spans.parquet")
    result, text = _report(root)
    assert result.exit_code == 0, result.output
    assert "run/fcfs: steps.parquet (not a readable Parquet file" in text
    assert "run/fcfs: spans.parquet (no request_id, start, end columns: left out)" in text


def test_a_cell_that_fails_past_its_checks_is_named_not_a_traceback(tmp_path, monkeypatch):
    """The last line of defence: whatever a cell's data does to its computation, the cell
    is named as broken, with the error, and the others are reported."""
    root = _run(tmp_path, policies=("fcfs", "sjf"))
    real = build.tables.policy_groups
    calls = []

    def fails_for_the_first_cell(frame, *args):  # cells are read in order: fcfs first
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a page that does not decode")
        return real(frame, *args)

    monkeypatch.setattr(build.tables, "policy_groups", fails_for_the_first_cell)
    report = build.build_report([root], ReportOptions(resamples=20, figures=False))
    assert [b.key for b in report.broken] == ["run/fcfs"]
    assert "cannot be read: ValueError: a page that does not decode" in report.broken[0].line()
    assert list(report.runs[0].policies) == ["sjf"]


def test_an_unknown_duration_gives_no_rate_and_no_goodput_verdict(tmp_path):
    """Rows without an end (ok without a token: ttft/e2e null) and no recorded duration:
    the duration is unknown, so the rates are too (not count / 1e-9)."""
    no_end = requests_frame(seed=1, n=60).with_columns(
        pl.lit(None, pl.Float64).alias("ttft_s"),
        pl.lit(None, pl.Float64).alias("e2e_s"),
        pl.lit(None, pl.Float64).alias("tpot_s"),
    )
    root = write_run(tmp_path / "run", {"fcfs": no_end, "sjf": requests_frame(seed=2, n=60)})
    paths = generate_report([root], root, ReportOptions(resamples=20))
    summary = json.loads(paths["summary"].read_text())
    overall = summary["policies"]["fcfs"]["overall"]
    assert overall["throughput_rps"] is None and overall["goodput_rps"] is None
    assert "fcfs" not in summary["verdicts"].get("goodput", {}).get("values", {})


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_simulated_run_reports_without_a_numpy_warning(tmp_path):
    """`schedscope run --simulate` on a small schedule, then its report, with every
    RuntimeWarning an error."""
    out = tmp_path / "sim"
    args = ["run", "--simulate", "--policy", "fcfs,sjf", "--duration-scale", "0.05"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    paths = generate_report([out], tmp_path / "again", ReportOptions(resamples=20))
    assert json.loads(paths["summary"].read_text())["verdicts"]


def test_a_run_under_a_path_with_brackets_is_read_as_it_is(tmp_path):
    """Polars reads ``[`` in a path as a glob: every file is opened as the path it is."""
    cells = {p: requests_frame(seed=n + 1, n=60) for n, p in enumerate(("fcfs", "sjf"))}
    root = write_run(tmp_path / "odd[" / "x]run", cells)
    result, text = _report(root)
    assert result.exit_code == 0, result.output
    assert "broken" not in text
    assert sorted(json.loads((root / "summary.json").read_text())["policies"]) == ["fcfs", "sjf"]


def test_a_line_naming_a_file_is_never_broken_inside_its_path(tmp_path, monkeypatch):
    """On a narrow terminal the notes (``missing:``), traps and the paths written are
    printed whole, so a path can be copied; rich used to break them at the width (a
    pytest-xdist run's longer temporary path showed it: 'sum mary.json')."""
    from rich.console import Console

    import harness.cli.report as report_cli

    monkeypatch.setattr(report_cli, "console", Console(width=30, markup=False))
    root = _run(tmp_path, policies=("fcfs", "sjf"))
    (root / "summary.json").write_text(json.dumps({"profile": 5, "policies": {}}))
    result = runner.invoke(app, ["report", str(root), "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"missing: run: {root / 'summary.json'}: profile is not a string: ignored" in lines
    assert f"summary: {root / 'summary.json'}" in lines
    assert f"report: {root / 'report.html'}" in lines
