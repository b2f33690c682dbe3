"""``schedscope simulate`` under SCHEDSCOPE_FAULT (engine/faults.py): an empty variable
changes no byte of the output, a planted fault is recorded in summary.json and shows in
the records, a bad one is a usage error naming its key."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from engine.faults import ENV_VAR
from harness.cli import app

runner = CliRunner()
#: A short simulation with the built-in cost model (no machine's store involved).
ARGS = ["--profile", "default", "--policy", "fcfs,sjf", "--num-requests", "200"]
ARGS += ["--cost-model", "builtin"]


def _simulate(tmp_path, name: str):
    out = tmp_path / name
    result = runner.invoke(app, ["simulate", *ARGS, "--out", str(out)])
    return result, out


def _files(out):
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


def test_an_empty_fault_variable_changes_no_byte(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    unset = _simulate(tmp_path, "unset")[1]
    monkeypatch.setenv(ENV_VAR, "")
    result, empty = _simulate(tmp_path, "empty")
    assert result.exit_code == 0, result.output
    assert "SCHEDSCOPE_FAULT active" not in result.output
    files = _files(unset)
    assert files == _files(empty) and len(files) == 9  # 2 policies x 4 files + the combined summary
    for rel in files:
        assert (unset / rel).read_bytes() == (empty / rel).read_bytes(), rel
    assert "faults" not in json.loads((unset / "summary.json").read_text())["policies"]["sjf"]

    # The comparison can tell: a planted fault changes the records and is recorded.
    monkeypatch.setenv(ENV_VAR, "decode_step_delay_s=0.01")
    result, faulted = _simulate(tmp_path, "faulted")
    assert result.exit_code == 0, result.output
    policy = json.loads((faulted / "summary.json").read_text())["policies"]["sjf"]
    assert policy["faults"] == {"decode_step_delay_s": 0.01}
    plain_e2e = pl.read_parquet(unset / "sjf" / "requests.parquet")["e2e_s"].mean()
    faulted_e2e = pl.read_parquet(faulted / "sjf" / "requests.parquet")["e2e_s"].mean()
    assert faulted_e2e > plain_e2e


def test_a_bad_fault_key_is_a_usage_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "decode_step_delay_s=0.01,jitter_s=0.5")
    result, out = _simulate(tmp_path, "bad")
    assert result.exit_code == 2, result.output
    assert "jitter_s" in result.output
    assert not out.exists()


def test_the_report_carries_the_planted_faults_to_its_summary(tmp_path, monkeypatch):
    """A gate reads the report's summary.json (version 2): it sees what was planted."""
    monkeypatch.setenv(ENV_VAR, "sjf_order=reversed")
    result, out = _simulate(tmp_path, "faulted")
    assert result.exit_code == 0, result.output
    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["schema_version"] == 2
    for policy in ("fcfs", "sjf"):
        assert summary["policies"][policy]["faults"] == {"sjf_order": "reversed"}


def test_a_step_slowdown_stretches_every_step_by_its_fraction(monkeypatch):
    """``step_slowdown=0.2``: every simulated step (its executor time) lasts 1.2x as long
    as without the fault, whatever its batch."""
    from engine.config import EngineConfig
    from harness.profiles import resolve_profile
    from harness.simulate.driver import simulate

    profile = resolve_profile("mixed").with_duration_scale(0.05)
    monkeypatch.delenv(ENV_VAR, raising=False)
    plain = simulate(profile, EngineConfig(), fast=False).steps
    monkeypatch.setenv(ENV_VAR, "step_slowdown=0.2")
    slowed = simulate(profile, EngineConfig(), fast=False).steps
    assert plain is not None and slowed is not None
    took = lambda steps: (steps["execute_end"] - steps["execute_start"]).to_numpy()  # noqa: E731
    # the same first step (nothing before it differs), 1.2x as long
    assert took(slowed)[0] == pytest.approx(1.2 * took(plain)[0], rel=1e-9)
    assert took(slowed).sum() > 1.15 * took(plain).sum()
