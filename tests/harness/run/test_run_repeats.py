"""`schedscope run --repeats N` / a run file's `repeats`: every cell N times as
`<cell>-r<k>`, in rounds; bad values are refused naming the key; the gate pools the
repeats of a simulated run back into one cell."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.gate.config import parse_config
from harness.gate.gate import run_gate
from harness.run.matrix import RunFileError, build_cells
from harness.run.plan import plan_run

runner = CliRunner()


def test_cells_repeat_in_rounds():
    cells = build_cells(["fcfs", "sjf"], {}, [], [1.0], repeats=3)
    assert [c.name for c in cells] == [
        "fcfs-r1", "sjf-r1", "fcfs-r2", "sjf-r2", "fcfs-r3", "sjf-r3",
    ]  # fmt: skip
    assert [c.repeat for c in cells] == [1, 1, 2, 2, 3, 3]
    assert all(c.group == f"-r{c.repeat}" for c in cells)  # policies compared per repeat
    assert [c.name for c in build_cells(["fcfs"], {}, [], [1.0])] == ["fcfs"]


def test_run_file_repeats_and_target_cells(tmp_path):
    run_file = tmp_path / "r.toml"
    run_file.write_text('policies = ["fcfs"]\nrate_scales = [1, 2]\nrepeats = 2\n')
    plan = plan_run(["sjf"], {}, 1.0, "mixed", 0.1, None, run_file=run_file)
    assert [c.name for c in plan.cells] == ["fcfs-x1-r1", "fcfs-x2-r1", "fcfs-x1-r2", "fcfs-x2-r2"]
    target = plan_run(["fcfs"], {}, 1.0, "mixed", 0.1, None, target_label="vllm", repeats=2)
    assert [c.name for c in target.cells] == ["vllm-r1", "vllm-r2"]
    run_file.write_text("repeats = 0\n")
    with pytest.raises(RunFileError, match="repeats: a whole number >= 1"):
        plan_run(["sjf"], {}, 1.0, "mixed", 0.1, None, run_file=run_file)


def test_the_cli_refuses_zero_repeats(tmp_path):
    result = runner.invoke(app, ["run", "--simulate", "--repeats", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--repeats" in result.output


def test_a_repeated_simulated_run_is_pooled_by_the_gate(tmp_path):
    out = tmp_path / "rep"
    # a known seed: the gate compares runs whose seed is known on both sides
    args = ["run", "--simulate", "--policy", "fcfs,sjf", "--duration-scale", "0.05", "--seed", "3"]
    result = runner.invoke(app, [*args, "--repeats", "2", "--no-report", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "fcfs-r1", "fcfs-r2", "sjf-r1", "sjf-r2",
    ]  # fmt: skip
    gate = run_gate(out, out, parse_config({"rule": [{"metric": "e2e", "max_regression": 0}]}))
    assert gate.exit_code == 0
    assert gate.current.cells["fcfs"].repeats == 2
    single = gate.current.cells["fcfs"].frame.height // 2
    assert gate.current.cells["fcfs"].frame.height == 2 * single > 0
