"""A served run whose grace ends with requests in flight: they are cut, counted and
censored — never dropped — from the load generator's rows to the report; and a run
without --grace waits as long as its cost model says its drain takes."""

from __future__ import annotations

import json

import polars as pl
import pytest

from engine.core.cost_model import CostModel
from tests.support.run_cli import schedscope_run

# served engines and Locust processes: the full suite's, not test-fast's
pytestmark = [pytest.mark.slow]


def test_a_short_grace_cuts_requests_that_the_statistics_count_as_censored(tmp_path):
    cost = tmp_path / "slow.json"
    CostModel.constant(0.05).save(cost)  # 4 sequences at a time at 50 ms a step: overload
    out = tmp_path / "run"
    proc = schedscope_run(
        [
            "--executor", "sim", "--cost-model", str(cost), "--max-num-seqs", "4",
            "--grace", "0.5", "--policy", "fcfs", "--duration-scale", "0.05",
            "--out", str(out),
        ],
        tmp_path / "store",
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fcfs: grace --grace 0.5" in proc.stdout
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet")
    cut = frame.filter(pl.col("cut_at").is_not_null())
    assert cut.height > 10 and set(cut["status"]) == {"aborted"}
    assert (cut["cut_at"] >= cut["scheduled_at"]).all()
    # the cell is degraded, and says why
    cell = json.loads((out / "fcfs" / "run.json").read_text())
    assert cell["status"] == "degraded"
    assert any(f["kind"] == "cut_in_flight" for f in cell["failures"])
    assert cell["grace"] == {
        "grace_s": 0.5, "predicted_drain_s": None, "source": "flag", "how": "--grace 0.5",
    }  # fmt: skip
    # summary.json: counted, SLO misses, and lower bounds over survivors and cut alike
    overall = json.loads((out / "summary.json").read_text())["policies"]["fcfs"]["overall"]
    assert overall["cut_in_flight"] == cut.height
    assert overall["slo_met"] <= frame.height - cut.height
    e2e = overall["metrics"]["e2e_s"]
    assert (
        e2e["censored"] == cut.height
        and e2e["count"]
        == frame.height
        - (frame.filter(pl.col("status").is_in(["error", "rejected"])).height)
        - frame.filter((pl.col("status") == "aborted") & pl.col("cut_at").is_null()).height
    )
    assert "p99" in e2e["lower_bound"]
    classes = pl.read_parquet(out / "classes.parquet")
    everything = classes.filter(pl.col("class") == "all").row(0, named=True)
    assert everything["n_cut_in_flight"] == cut.height and "e2e_s_p99" in everything["lower_bounds"]
    report = (out / "report.md").read_text()
    assert f"CUT: run/fcfs: {cut.height} of {frame.height} requests" in report
    assert "≥ " in report


def test_without_grace_each_cell_waits_for_its_predicted_drain(tmp_path):
    cost = tmp_path / "fast.json"
    CostModel.constant(0.002).save(cost)
    out = tmp_path / "run"
    proc = schedscope_run(
        [
            "--executor", "sim", "--cost-model", str(cost), "--policy", "fcfs",
            "--duration-scale", "0.05", "--out", str(out),
        ],
        tmp_path / "store",
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = json.loads((out / "fcfs" / "run.json").read_text())
    grace = cell["grace"]
    assert grace["source"] == "cost model" and str(cost) in grace["how"]
    assert grace["grace_s"] == 30.0 + 3.0 * grace["predicted_drain_s"]
    assert f"fcfs: grace {grace['how']}" in proc.stdout
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet")
    assert frame["cut_at"].null_count() == frame.height  # nothing was cut
