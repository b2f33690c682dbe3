"""`schedscope run --target` against a hostile server: the run ends with its report.

The target is tests/support/hostile_target.py: its requests take, in turn, a correct
stream or one hostile behaviour each (a string usage count, 3,000,000 completion tokens
claimed, negative, boolean, NaN and 1e300 counts, an error message ``[/evil] boom
<script>alert(1)</script>``, a data line that is not JSON, an endless line, a flood of
comments, an endless trickle of ``: ping``...). Such a run had ended in a traceback
(Polars' ComputeError in the merge; Rich's MarkupError printing the commonest error)
with no report. A real `schedscope run` (Locust in a subprocess) of
tests/data/locust_small.py (3 s, then --grace 4 s for the endless ping).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest

from harness.profiles import build_plan, load_profile
from tests.support.hostile_target import MARKUP, MODES, OK_MODES, HostileTarget
from tests.support.paths import DATA, REPO

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("own_store")]

#: one cycle of the target: correct streams between the hostile ones, the markup error
#: the commonest (so the console prints it as the cell's commonest error)
CYCLE = (
    "good",
    "markup_error_body",
    "prompt_tokens_string",
    "good",
    "completion_tokens_huge",
    "markup_error_body",
    "negative_count",
    "float_count",
    "not_json",
    "markup_error_body",
    "bool_count",
    "good",
    "nan_count",
    "huge_float",
    "huge_prompt_count",
    "good",
    "finish_reason_object",
    "text_number",
    "markup_error_event",
    "long_error_body",
    "good",
    "endless_line",
    "ping_flood",
    "endless_ping",
)


def test_a_hostile_target_s_run_ends_with_a_report_and_a_row_per_request(tmp_path):
    out = tmp_path / "run"
    profile = DATA / "locust_small.py"
    command = [sys.executable, "-m", "harness.cli", "run", "--target"]
    with HostileTarget(CYCLE) as target:
        proc = subprocess.run(
            [*command, target.url, "--profile", str(profile), "--duration-scale", "1"]
            + ["--grace", "4", "--out", str(out)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assigned = dict(target.assigned)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    # most requests failed: docs/run.md's "Exit codes", 3
    assert proc.returncode == 3, text
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert MARKUP in proc.stdout  # the commonest error, printed as the target sent it

    frame = pl.read_parquet(out / "target" / "requests.parquet")
    ids = frame["request_id"].to_list()
    assert len(ids) == len(set(ids))
    open_ids = {s.request_id for s in build_plan(load_profile(profile)).open_loop_requests()}
    assert open_ids <= set(ids)  # every scheduled request has its row
    assert set(assigned) <= set(ids)  # and every request sent
    assert set(assigned.values()) == set(CYCLE)  # each behaviour was met

    rows = {r["request_id"]: r for r in frame.iter_rows(named=True)}
    for request_id, mode in assigned.items():
        row, field = rows[request_id], MODES[mode][1]
        if mode in OK_MODES:
            assert row["status"] == "ok", (mode, row["error"])
            assert row["output_tokens"] == row["max_tokens"]
        elif mode == "endless_ping":  # never a token: cut when --grace ran out
            assert row["status"] == "aborted", (mode, row["status"], row["error"])
        else:
            assert row["status"] == "error", (mode, row["status"], row["error"])
            if field is not None:
                assert field in row["error"], (mode, row["error"])
        assert len(row["itl_s"] or []) <= max(row["max_tokens"] - 1, 0)

    info = json.loads((out / "run.json").read_text())
    assert info["error_rate_exceeded"] == ["target"]
    assert MARKUP in json.dumps(info["results"]["target"]["errors"])
