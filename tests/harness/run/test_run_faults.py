"""``schedscope run`` with SCHEDSCOPE_FAULT (engine/faults.py): the cell's run.json and
summary.json record the planted faults; a bad one stops the run before any cell, naming
its key. (A served cell's faults come from its server's /health:
tests/engine/serving/test_faults_served.py shows the server's side.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from engine.faults import ENV_VAR
from harness.costmodel import store as cost_store
from tests.support.paths import REPO

ARGS = ["--simulate", "--policy", "fcfs", "--duration-scale", "0.05", "--no-report"]
ARGS += ["--cost-model", "builtin"]


def _run(tmp_path, faults: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV_VAR: faults}
    env[cost_store.STORE_ENV] = str(tmp_path / "store")
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", *ARGS, "--out", str(tmp_path / "run")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_simulated_cell_records_its_planted_faults(tmp_path):
    proc = _run(tmp_path, "prefill_token_delay_s=0.0005,sjf_order=reversed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SCHEDSCOPE_FAULT active: prefill_token_delay_s=0.0005,sjf_order=reversed" in (
        proc.stdout + proc.stderr
    )
    cell = tmp_path / "run" / "fcfs"
    planted = {"prefill_token_delay_s": 0.0005, "sjf_order": "reversed"}
    assert json.loads((cell / "run.json").read_text())["faults"] == planted
    assert json.loads((cell / "summary.json").read_text())["policies"]["fcfs"]["faults"] == planted


def test_without_faults_the_cell_records_none(tmp_path):
    proc = _run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = tmp_path / "run" / "fcfs"
    assert json.loads((cell / "run.json").read_text())["faults"] == {}
    assert "faults" not in json.loads((cell / "summary.json").read_text())["policies"]["fcfs"]


def test_a_bad_fault_stops_the_run_before_any_cell(tmp_path):
    proc = _run(tmp_path, "decode_step_delay_s=-1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "decode_step_delay_s" in proc.stderr
    assert not (tmp_path / "run").exists()
