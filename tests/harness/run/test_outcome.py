"""One rule for a cell's status and the run's exit code (harness/run/outcome.py): a cell in
which no request completed, or that started fewer load-generator workers than expected,
failed (exit 1); rows short of the schedule with no lost worker to explain them degrade
it. Each of these passed as "ok", exit 0, before (a hostile review's findings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from harness.run import outcome
from harness.run.cell_result import CellResult
from harness.run.matrix import Cell
from tests.support.paths import DATA, REPO


def _result(counts: dict, scheduled: int = 10) -> CellResult:
    r = CellResult(Cell("fcfs", "fcfs", None, 1.0, {}), Path("."), "target")
    r.counts = dict(counts)
    r.scheduled = scheduled
    return r


def test_a_cell_with_no_completed_request_failed():
    r = _result({"aborted": 10})  # every request cut in flight: not errors, yet nothing measured
    outcome.judge_load(r, {}, 10)
    assert [f["kind"] for f in r.failures] == [outcome.NO_COMPLETED]
    assert outcome.status(r) == "failed"
    assert outcome.exit_code([r], []) == outcome.INFRASTRUCTURE_EXIT


def test_a_cell_whose_requests_all_failed_failed_with_the_error_rate_exit():
    # The server answered every request with a failure: a measurement of it (exit 3,
    # whatever --max-error-rate), not an infrastructure failure.
    r = _result({"error": 6, "rejected": 4})
    r.errors = {"failed": 10, "requests": 10, "error_rate": 1.0}
    outcome.judge_load(r, {}, 10)
    assert [f["kind"] for f in r.failures] == [outcome.NO_COMPLETED]
    assert "only failures" in r.failures[0]["message"]
    assert outcome.status(r) == "failed" and not r.infrastructure_failure
    assert outcome.exit_code([r], []) == outcome.ERROR_RATE_EXIT


def test_a_cell_with_no_rows_at_all_failed():
    r = _result({})
    outcome.judge_load(r, {}, None)
    assert outcome.status(r) == "failed"
    assert "no rows" in r.failures[0]["message"]


def test_fewer_workers_than_expected_fails_the_cell():
    r = _result({"ok": 10})
    outcome.judge_load(r, {"workers_expected": 2, "workers_started": 1}, 10)
    assert [f["kind"] for f in r.failures] == [outcome.WORKER_SHORTFALL]
    assert "1 of the 2 expected" in r.failures[0]["message"]
    assert outcome.exit_code([r], []) == outcome.INFRASTRUCTURE_EXIT


def test_rows_short_of_the_schedule_degrade_the_cell_unless_a_lost_worker_explains_them():
    r = _result({"ok": 7})
    outcome.judge_load(r, {}, 7)
    assert [f["kind"] for f in r.failures] == [outcome.ROWS_MISSING]
    assert outcome.status(r) == "degraded" and outcome.exit_code([r], []) == outcome.OK_EXIT
    lost = _result({"ok": 7})
    lost.fail("worker_lost", "worker 1 was lost")
    outcome.judge_load(lost, {}, 7)
    assert [f["kind"] for f in lost.failures] == ["worker_lost"]


def test_a_healthy_cell_stays_ok():
    r = _result({"ok": 9, "error": 1})
    outcome.judge_load(r, {"workers_expected": 2, "workers_started": 2}, 10)
    assert r.failures == [] and outcome.status(r) == "ok"


@given(
    ok=st.integers(0, 5),
    other=st.integers(0, 5),
    cut=st.integers(0, 5),
    infra=st.booleans(),
    over=st.booleans(),
)
def test_the_exit_code_follows_the_documented_precedence(ok, other, cut, infra, over):
    counts = {k: v for k, v in (("ok", ok), ("error", other), ("aborted", cut)) if v}
    r = _result(counts, scheduled=ok + other + cut)
    r.errors = {"failed": other}  # cut rows are the run's end, not the server's failures
    if infra:
        r.fail("server_start", "did not come up", infrastructure=True)
    outcome.judge_load(r, {}, ok + other + cut)
    code = outcome.exit_code([r], [r] if over else [])
    if infra or (ok == 0 and other == 0):
        assert code == 1 and outcome.status(r) == "failed"
    elif ok == 0:
        assert code == 3 and outcome.status(r) == "failed"
    else:
        assert code == (3 if over else 0) and outcome.status(r) != "failed"
    assert code != 0 or ok > 0  # a run in which nothing completed never exits 0


def test_a_run_whose_only_cell_completed_nothing_exits_3_even_at_any_error_rate(
    tmp_path, own_store
):
    # --max-model-len 8 rejects every prompt of the profile: no request completes, and
    # --max-error-rate 1 allows every failure; it passed as ok, exit 0.
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--simulate", "--profile",
         str(DATA / "locust_small.py"), "--policy", "fcfs", "--max-model-len", "8",
         "--max-error-rate", "1", "--no-report", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    cell = json.loads((out / "fcfs" / "run.json").read_text())
    assert cell["status"] == "failed"
    assert [f["kind"] for f in cell["failures"]] == [outcome.NO_COMPLETED]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
