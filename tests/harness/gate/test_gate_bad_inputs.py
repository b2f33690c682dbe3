"""Exit 2 (a usage or data error), never 1 (a regression), for inputs that cannot be
gated, each named: malformed baseline files of every kind, impossible values
(infinite, NaN or negative latencies, a negative duration), a side with no request or
no finished request to compare with, a run directory whose records are broken
(docs/gate.md, exit codes). A current run whose requests all failed is a regression."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.gate_runs import requests_frame, write_run

runner = CliRunner()
RULES = (
    '[[rule]]\nclass = "*"\nmetric = "ttft"\nmax_regression = 0.1\n'
    '[[rule]]\nmetric = "error_rate"\nmax = 0.5\n'
)


def gate(tmp_path, base, current, config: str = RULES):
    rules = tmp_path / "gate.toml"
    rules.write_text(config)
    args = ["gate", "--baseline", str(base), "--current", str(current), "--config", str(rules)]
    result = runner.invoke(app, args)
    return result, " ".join(result.output.split())


def _baseline(tmp_path) -> tuple:
    """A run, and the body of its baseline file (written by `baseline update`)."""
    run = write_run(tmp_path / "run", {"fcfs": requests_frame(1, n=40)})
    path = tmp_path / "made.json"
    made = runner.invoke(app, ["baseline", "update", "--from", str(run), "--out", str(path)])
    assert made.exit_code == 0, made.output
    return run, json.loads(path.read_text())


def _cell(body: dict) -> dict:
    return body["cells"]["fcfs"]


def _set_value(column: str, value, row: int = 3):
    def edit(body: dict) -> None:
        cell = _cell(body)
        cell["rows"][row][cell["columns"].index(column)] = value

    return edit


def _all_failed(body: dict) -> None:
    cell = _cell(body)
    for row in cell["rows"]:
        row[cell["columns"].index("status")] = "error"


#: (what is wrong, how the body is spoiled — or the file's text —, what the error names)
BAD_BASELINES = [
    ("not_json", "{not json", "not valid JSON"),
    ("a_list", "[1, 2]", "expected a JSON object"),
    ("no_cells_key", lambda b: b.pop("cells"), "cells: expected an object of cells"),
    ("cells_a_list", lambda b: b.__setitem__("cells", []), "cells: expected an object"),
    ("no_cell", lambda b: b.__setitem__("cells", {}), "a baseline with no cells"),
    ("cell_a_list", lambda b: b["cells"].__setitem__("fcfs", [1]), "cell fcfs: expected an object"),
    ("version", lambda b: b.__setitem__("baseline_version", 99), "baseline_version 99"),
    (
        "missing_column",
        lambda b: _cell(b).__setitem__("columns", _cell(b)["columns"][1:]),
        "cell fcfs lacks the column request_id",
    ),
    (
        "columns_a_string",
        lambda b: _cell(b).__setitem__("columns", "request_id,class"),
        "columns: expected a list of names",
    ),
    ("rows_a_string", lambda b: _cell(b).__setitem__("rows", "x"), "rows: expected a list"),
    ("short_row", lambda b: _cell(b)["rows"][0].pop(), "rows do not fit the columns"),
    ("edited_schedule", lambda b: _cell(b)["rows"].pop(), "not the schedule it records"),
    ("infinite_ttft", _set_value("ttft_s", math.inf), "request r00003 has ttft_s inf"),
    ("nan_e2e", _set_value("e2e_s", math.nan), "request r00003 has e2e_s NaN"),
    ("negative_ttft", _set_value("ttft_s", -5.0), "request r00003 has ttft_s -5"),
    ("negative_gap", _set_value("itl_s", [0.1, -0.2]), "a gap of -0.2 in itl_s"),
    ("unknown_status", _set_value("status", "done"), "has status 'done'"),
    (
        "negative_duration",
        lambda b: _cell(b).__setitem__("duration_s", -60.0),
        "cell fcfs: duration_s -60.0 is not a duration",
    ),
    (
        "text_duration",
        lambda b: _cell(b).__setitem__("duration_s", "long"),
        "duration_s 'long' is not a duration",
    ),
    ("zero_repeats", lambda b: _cell(b).__setitem__("repeats", 0), "repeats 0 is not a count"),
    ("identity_a_list", lambda b: b.__setitem__("identity", [1]), "identity: expected an object"),
    (
        "all_failed",
        _all_failed,
        "the baseline (BASELINE) has no value for any line it is compared on",
    ),
]


def test_a_class_that_finished_nothing_in_the_baseline_is_one_open_line(tmp_path):
    # One starved class (no finished request in the baseline) leaves its line without a
    # comparison and the other classes gated: it used to make the whole gate exit 2.
    frame = requests_frame(1, n=40)
    starved = frame.with_columns(
        pl.when(pl.col("class") == pl.col("class").first())
        .then(pl.lit("error"))
        .otherwise(pl.col("status"))
        .alias("status")
    )
    base = write_run(tmp_path / "base", {"fcfs": starved})
    current = write_run(tmp_path / "current", {"fcfs": frame})
    result, text = gate(tmp_path, base, current)
    assert result.exit_code == 0, result.output
    assert "no comparison: the baseline" in text and "with no baseline value" in text


@pytest.mark.parametrize(
    ("spoil", "named"), [c[1:] for c in BAD_BASELINES], ids=[c[0] for c in BAD_BASELINES]
)
def test_a_malformed_baseline_is_exit_2_naming_the_file_and_field(tmp_path, spoil, named):
    run, body = _baseline(tmp_path)
    path = tmp_path / "baseline.json"
    if isinstance(spoil, str):
        path.write_text(spoil)
    else:
        spoil(body)
        # Python's json writes inf/nan as Infinity/NaN, as a hand edit would
        path.write_text(json.dumps(body))
    result, text = gate(tmp_path, path, run)
    assert result.exit_code == 2, result.output
    assert named.replace("BASELINE", str(path)) in text
    assert str(path) in text


def test_a_missing_baseline_file_is_exit_2(tmp_path):
    run, _ = _baseline(tmp_path)
    result, text = gate(tmp_path, tmp_path / "nowhere.json", run)
    assert result.exit_code == 2 and "no such file or directory" in text


def test_zero_rows_on_both_sides_is_a_data_error(tmp_path):
    empty = requests_frame(1, n=40).head(0)
    base = write_run(tmp_path / "a", {"fcfs": empty})
    cur = write_run(tmp_path / "b", {"fcfs": empty})
    result, text = gate(tmp_path, base, cur)
    assert result.exit_code == 2, result.output
    assert "cell fcfs has no request rows: nothing to gate" in text


def test_a_current_run_whose_requests_all_failed_is_a_regression(tmp_path):
    """What the change did, not a fault of the data: exit 1, the lines say why."""
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1, n=40)})
    cur = write_run(tmp_path / "b", {"fcfs": requests_frame(2, n=40, errors=40)})
    result, text = gate(tmp_path, base, cur)
    assert result.exit_code == 1, result.output
    assert "no finished request of this class in the current run" in text


def test_a_broken_requests_parquet_in_a_run_is_named(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1, n=40)})
    cur = write_run(tmp_path / "b", {"fcfs": requests_frame(2, n=40)})
    spoiled = requests_frame(2, n=40).with_columns(
        pl.when(pl.col("request_id") == "r00004")
        .then(math.inf)
        .otherwise(pl.col("e2e_s"))
        .alias("e2e_s")
    )
    spoiled.write_parquet(cur / "fcfs" / "requests.parquet")
    result, text = gate(tmp_path, base, cur)
    assert result.exit_code == 2, result.output
    assert f"{cur / 'fcfs' / 'requests.parquet'}: request r00004 has e2e_s inf" in text


def test_a_negative_duration_in_a_run_s_summary_is_refused(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1, n=40)})
    cur = write_run(tmp_path / "b", {"fcfs": requests_frame(2, n=40)}, durations={"fcfs": -60.0})
    result, text = gate(tmp_path, base, cur)
    assert result.exit_code == 2, result.output
    assert "cell fcfs: duration_s -60.0 is not a duration" in text


def test_goodput_without_a_known_duration_is_a_data_error(tmp_path):
    """Rows without an end and no recorded duration: a rate over an unknown span."""
    no_end = requests_frame(2, n=40).with_columns(
        pl.lit(None, pl.Float64).alias(c) for c in ("ttft_s", "tpot_s", "e2e_s")
    )
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1, n=40)})
    cur = write_run(tmp_path / "b", {"fcfs": no_end})
    config = '[[rule]]\nmetric = "goodput"\nmin = 0.1\n'
    result, text = gate(tmp_path, base, cur, config)
    assert result.exit_code == 2, result.output
    assert "cell fcfs has no known duration" in text
