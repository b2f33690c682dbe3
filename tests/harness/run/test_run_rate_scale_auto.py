"""``schedscope run --rate-scale auto[:F]``: the scale chosen from the engine's capacity,
printed, applied to every cell and recorded in run.json and the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.core.cost_model import CostModel
from tests.support.run_cli import schedscope_run


def _run(tmp_path: Path, *args: str):
    return schedscope_run(list(args), tmp_path / "store", timeout=240)


def test_auto_scales_every_cell_to_the_fraction_of_the_simulated_capacity(tmp_path):
    out = tmp_path / "run"
    cost = tmp_path / "cost.json"
    CostModel.constant(0.01).save(cost)
    proc = _run(
        tmp_path, "--simulate", "--rate-scale", "auto:0.5", "--cost-model", str(cost),
        "--duration-scale", "0.1", "--policy", "fcfs,sjf", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rate scale: auto:0.5 -> " in proc.stderr
    info = json.loads((out / "run.json").read_text())
    chosen = info["rate_scale_auto"]
    assert chosen["fraction"] == 0.5 and chosen["method"] == "simulated"
    assert str(cost) in chosen["how"]
    assert chosen["factor"] == pytest.approx(0.5 * chosen["capacity_rps"] / chosen["offered_rps"])
    assert {c["rate_scale"] for c in info["cells"]} == {chosen["factor"]}
    cell = json.loads((out / "sjf" / "run.json").read_text())
    assert cell["rate_scale"] == chosen["factor"]
    report = (out / "report.md").read_text()
    assert "rate scale: auto:0.5" in report and "= 50% of it" in report


def test_a_run_files_rate_scales_are_multiples_of_the_chosen_scale(tmp_path):
    run_file = tmp_path / "sweep.toml"
    run_file.write_text('policies = ["fcfs"]\nrate_scales = [0.5, 1]\nduration_scale = 0.1\n')
    out = tmp_path / "run"
    proc = _run(
        tmp_path, "--simulate", "--rate-scale", "auto", "--run-file", str(run_file),
        "--cost-model", "builtin", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads((out / "run.json").read_text())
    factor = info["rate_scale_auto"]["factor"]
    rates = {c["name"]: c["rate_scale"] for c in info["cells"]}
    assert rates == {"fcfs-x0.5": pytest.approx(0.5 * factor), "fcfs-x1": pytest.approx(factor)}


@pytest.mark.parametrize(
    ("value", "says"),
    [("auto:0", "F must be in"), ("fast", "expected a number"), ("-2", "must be > 0")],
)
def test_a_bad_rate_scale_is_a_usage_error_naming_the_flag(tmp_path, value, says):
    proc = _run(tmp_path, "--simulate", "--rate-scale", value, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--rate-scale" in proc.stderr and says in proc.stderr


@pytest.mark.slow
def test_the_built_in_model_forced_is_brought_to_this_machines_speed_first(tmp_path):
    """A served torch run with ``--cost-model builtin``: the built-in was fitted on another
    machine, so a probe of the torch executor here scales it before the capacity is
    simulated; run.json says so, and the capacity is the scaled model's."""
    from engine.config import EngineConfig
    from harness.profiles import resolve_profile
    from harness.simulate.capacity import simulated_capacity

    out = tmp_path / "run"
    proc = _run(
        tmp_path, "--rate-scale", "auto:0.5", "--cost-model", "builtin", "--policy", "fcfs",
        "--duration-scale", "0.04", "--no-report", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "probing this machine's speed with the torch executor" in proc.stderr
    chosen = json.loads((out / "run.json").read_text())["rate_scale_auto"]
    found = re.search(r"the built-in cost model at (\d+\.\d+)x its step costs \(a ", chosen["how"])
    assert found, chosen["how"]
    assert "probe of the torch executor" in chosen["how"]
    ratio = float(found.group(1))
    profile = resolve_profile("mixed").with_duration_scale(0.04)
    scaled = simulated_capacity(profile, EngineConfig(), CostModel().at_speed(ratio), None, "x")
    # the ratio is printed to 2 decimals: the capacity of the rounded ratio is within 1%
    assert chosen["capacity_rps"] == pytest.approx(scaled.requests_per_s, rel=0.01)
