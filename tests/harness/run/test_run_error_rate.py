"""`schedscope run --max-error-rate`: a cell whose share of failed requests is over it
makes the run exit 3, saying which cells and why (simulated: prompts beyond
--max-model-len are rejected, a quarter of tests/data/locust_small.py's requests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import DATA, REPO

PROFILE = str(DATA / "locust_small.py")

pytestmark = [pytest.mark.usefixtures("own_store")]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--simulate", "--profile", PROFILE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_cell_over_the_error_rate_exits_3_naming_it_and_its_errors(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "--duration-scale", "1", "--max-model-len", "128", "--policy", "fcfs", "--out", str(out)
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    text = proc.stdout
    assert "why requests failed" in text
    assert "fcfs: 12 of 47 requests failed (25.5%)" in text
    assert "12x rejected: exceeds_max_model_len" in text
    assert "error rate over --max-error-rate 0.05: fcfs (25.5%); exit code 3" in text
    assert text.strip().splitlines()[-1] == str(out / "report.html")  # still the last line
    info = json.loads((out / "run.json").read_text())
    assert info["error_rate_exceeded"] == ["fcfs"] and info["max_error_rate"] == 0.05
    cell = json.loads((out / "fcfs" / "run.json").read_text())
    assert cell["errors"]["failed"] == 12 and cell["errors"]["top"][0]["count"] == 12
    md = (out / "report.md").read_text()
    assert "HIGH ERROR RATE: run/fcfs: 12 of 47 requests failed (25.5%)" in md


def test_a_higher_limit_passes_and_a_bad_one_is_a_usage_error(tmp_path):
    proc = run_cli(
        "--duration-scale", "1", "--max-model-len", "128", "--policy", "fcfs",
        "--max-error-rate", "0.5", "--no-report", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fcfs: 12 of 47 requests failed" in proc.stdout  # still said
    assert "error rate over" not in proc.stdout
    bad = run_cli("--max-error-rate", "1.5", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--max-error-rate" in bad.stderr
    bad = run_cli("--prompt-mode", "tokens", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "token_ids, text, auto" in bad.stderr
