"""A worker's plan check (harness/loadgen/plan_check.py): the facts it compares, the
mismatch it raises, the master's account of a worker that did not run its share."""

from __future__ import annotations

import json

from harness.loadgen.plan_check import PlanMismatch, check_plan, failure_message, worker_failure
from harness.profiles import build_plan
from harness.profiles.digest import plan_digest
from harness.run.cell_result import CellResult
from harness.run.collect import client_records
from harness.run.matrix import Cell
from tests.harness.profiles.test_digest import WITH_CLOSED


def test_a_worker_checks_its_plan_against_the_masters():
    plan = build_plan(WITH_CLOSED)
    master = check_plan(plan, None)
    assert master["profile"] == "digest_test" and master["closed_phases"] == 1
    assert check_plan(build_plan(WITH_CLOSED), master) == master
    other = build_plan(WITH_CLOSED, seed=9)
    try:
        check_plan(other, master)
    except PlanMismatch as e:
        mismatch = e
    else:
        raise AssertionError("a plan with another seed passed the check")
    assert mismatch.facts == {"master": master, "worker": check_plan(other, None)}
    assert str(mismatch) == (
        f"its schedule is not the master's: digest {plan_digest(other)} (profile "
        f"digest_test, seed 9, {other.num_open_requests} open-loop requests) against the "
        f"master's {master['digest']} (profile digest_test, seed 4, "
        f"{plan.num_open_requests} open-loop requests); it sent no request"
    )


def test_a_failed_worker_counts_what_of_its_share_has_no_row():
    summary = {"worker": 1, "error": "ProfileError: no", "pid": 7, "client_id": "gen-2_ab"}
    failed = worker_failure(summary, ["a", "b", "c"], {"b"}, 2)
    assert failed["missing_request_ids"] == ["a", "c"] and failed["rows_received"] == 1
    assert failure_message(failed) == (
        "load-generator worker 1 (gen-2_ab) could not start: ProfileError: no; 2 of its 3 "
        "scheduled open-loop requests have no record (2 closed loop(s) not run)"
    )


def test_one_process_that_could_not_start_fails_its_cell(tmp_path):
    """No master counts its share: the line says what failed, and the cell fails."""
    summary = {"run_id": "r", "worker": 0, "workers": 1, "pid": 5, "error": "ProfileError: x"}
    (tmp_path / "summary-0-5.json").write_text(json.dumps(summary))
    result = CellResult(Cell("c", "fcfs", None, 1.0, {}), tmp_path, "serve")
    info: dict = {}
    client_records(result, tmp_path, info)
    assert result.failures == [
        {
            "kind": "worker_failed",
            "message": "load-generator worker 0 could not start: ProfileError: x",
        }
    ]
    assert result.infrastructure_failure
    assert info["loadgen"]["failed_workers"] == [summary]
