"""The gate on simulated runs (real `schedscope simulate` output): the same inputs pass
exactly, a change of scheduling results fails (rules and the exact check), a summary.json
side works for simulated runs, and the committed simulated baseline in ci/ passes
against this tree (what .ci/run checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.gate.config import parse_config
from harness.gate.gate import run_gate

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]


def simulate(out: Path, *extra: str) -> Path:
    args = ["simulate", "--profile", "mixed", "--policy", "fcfs,sjf", "--duration-scale", "0.08"]
    result = runner.invoke(
        app, [*args, "--seed", "3", "--cost-model", "builtin", "--out", str(out), *extra]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    return {
        "a": simulate(root / "a"),
        "b": simulate(root / "b"),
        "tight": simulate(root / "tight", "--max-num-seqs", "3"),
    }


def test_the_same_simulation_passes_exactly(runs):
    result = run_gate(
        runs["a"],
        runs["b"],
        parse_config({"rule": [{"class": "*", "metric": "ttft", "max_regression": 0.0}]}),
    )
    assert result.exit_code == 0
    regression = [c for c in result.checks if c.kind == "regression"]
    assert regression and all(c.method == "exact" and c.change == 0 for c in regression)
    exact = [c for c in result.checks if c.kind == "exact"]
    assert {c.cell for c in exact} == {"fcfs", "sjf"} and all(c.passed for c in exact)


def test_a_change_in_scheduling_fails_the_rules_and_the_exact_check(runs):
    result = run_gate(
        runs["a"],
        runs["tight"],
        parse_config({"rule": [{"class": "*", "metric": "ttft", "max_regression": 0.1}]}),
    )
    assert result.exit_code == 1
    failed = {(c.rule, c.cell) for c in result.checks if not c.passed}
    assert ("simulated_exact", "fcfs") in failed and ("rule1", "sjf") in failed
    exact = next(c for c in result.checks if c.kind == "exact" and c.cell == "fcfs")
    assert "requests differ" in exact.message and "update the baseline" in exact.message


def test_rules_mode_ignores_changes_within_the_rules(runs):
    lenient = parse_config(
        {"gate": {"simulated": "rules"}, "rule": [{"metric": "error_rate", "max": 0.5}]}
    )
    result = run_gate(runs["a"], runs["tight"], lenient)
    assert result.exit_code == 0 and all(c.kind != "exact" for c in result.checks)


def test_simulated_summary_json_sides_compare_deterministically(runs):
    config = parse_config(
        {"rule": [{"class": "*", "metric": "e2e", "percentile": 99, "max_regression": 0.05}]}
    )
    same = run_gate(runs["a"] / "summary.json", runs["b"] / "summary.json", config)
    assert same.exit_code == 0 and same.baseline.kind == "summary"
    worse = run_gate(runs["a"] / "summary.json", runs["tight"] / "summary.json", config)
    assert worse.exit_code == 1
    odd = parse_config({"rule": [{"metric": "e2e", "percentile": 75, "max": 100}]})
    with pytest.raises(ValueError, match="not p75"):
        run_gate(runs["a"] / "summary.json", runs["b"] / "summary.json", odd)


def _edited_summary(run: Path, out: Path, edit) -> Path:
    """``run``'s summary.json with ``edit`` applied to each policy, written to ``out``."""
    body = json.loads((run / "summary.json").read_text())
    for policy in body["policies"].values():
        edit(policy)
    out.write_text(json.dumps(body))
    return out


def test_a_summary_json_key_on_one_side_only_fails_the_exact_check(runs, tmp_path):
    """The exact comparison of two summary.json used to cut both to the keys they share:
    a current run that lost a class, or a group that lost its metrics, read "summary.json
    statistics identical" under class-"all" rules. Now only keys known to differ
    legitimately are left out; any other key on one side only fails, named."""
    config = parse_config({"rule": [{"metric": "error_rate", "max": 0.5}]})
    baseline = runs["a"] / "summary.json"
    one_class = _edited_summary(
        runs["b"], tmp_path / "one_class.json", lambda p: p["classes"].pop("long_generation")
    )
    result = run_gate(baseline, one_class, config)
    assert result.exit_code == 1
    exact = [c for c in result.checks if c.kind == "exact"]
    assert exact and not any(c.passed for c in exact)
    assert all("classes.long_generation (only the baseline)" in c.message for c in exact)
    no_metrics = _edited_summary(
        runs["b"], tmp_path / "no_metrics.json", lambda p: p["overall"].pop("metrics")
    )
    exact = [c for c in run_gate(baseline, no_metrics, config).checks if c.kind == "exact"]
    assert exact and all(not c.passed and "overall.metrics (only the baseline)" in c.message
                         for c in exact)  # fmt: skip
    # the other way round too
    exact = [c for c in run_gate(no_metrics, baseline, config).checks if c.kind == "exact"]
    assert all(not c.passed and "overall.metrics (only the current)" in c.message for c in exact)


def test_a_report_s_summary_json_compares_exactly_with_a_run_s(runs, tmp_path):
    """Version 2 (the report's) carries group keys version 1 lacks (ONE_SIDED_KEYS): left
    out, the rest compared; the same simulation passes."""
    report = runner.invoke(app, ["report", str(runs["b"]), "--out", str(tmp_path / "r")])
    assert report.exit_code == 0, report.output
    config = parse_config({"rule": [{"metric": "error_rate", "max": 0.5}]})
    result = run_gate(runs["a"] / "summary.json", tmp_path / "r" / "summary.json", config)
    assert result.exit_code == 0, [c.message for c in result.checks]
    exact = [c for c in result.checks if c.kind == "exact"]
    assert {c.cell for c in exact} == {"fcfs", "sjf"}
    assert all(c.message == "summary.json statistics identical" for c in exact)


def test_the_simulated_gate_of_ci_passes_on_this_tree(tmp_path):
    """ci/gate-simulated.sh against ci/baselines/simulated.json: if this fails, a change
    moved scheduling results; rerun `bash ci/gate-simulated.sh --update` in that change."""
    out = tmp_path / "not" / "yet"  # the script makes its output folder
    env = {**os.environ, "OUT": str(out), "SCHEDSCOPE": f"{sys.executable} -m harness.cli"}
    done = subprocess.run(
        ["bash", str(ROOT / "ci" / "gate-simulated.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    body = json.loads((out / "gate-simulated.json").read_text())
    assert body["result"] == "pass"
    assert {c["cell"] for c in body["checks"] if c["kind"] == "exact"} == {
        "fcfs",
        "sjf",
        "priority",
        "lpm",
    }
    assert (out / "gate-simulated.xml").is_file()
