"""A run without --seed records the seed its schedule used (the profile's own), so its
files say which schedule they hold and the gate can compare two such runs."""

from __future__ import annotations

import json

from harness.profiles import resolve_profile
from tests.support.run_cli import schedscope_run


def test_a_run_without_seed_records_the_profiles_seed(tmp_path):
    out = tmp_path / "run"
    proc = schedscope_run(
        ["--simulate", "--duration-scale", "0.05", "--policy", "fcfs", "--out", str(out)],
        tmp_path / "store",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seed = resolve_profile("mixed").seed
    assert json.loads((out / "run.json").read_text())["seed"] == seed
    assert json.loads((out / "fcfs" / "run.json").read_text())["seed"] == seed
    assert json.loads((out / "summary.json").read_text())["seed"] == seed
