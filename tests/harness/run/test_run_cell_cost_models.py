"""A run file's knob sets may set the run settings a fingerprint covers (torch threads,
the executor) besides engine knobs (the model): ``schedscope run --simulate`` then
simulates each cell with the stored fit for that cell's own fingerprint, and says which
per cell. In process, simulated (seconds); the served cells' check is
test_run_simulator_check.py's (and test_run.py's, served)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.core.cost_model import CostModel
from harness.cli import app
from harness.costmodel import store as cost_store
from harness.costmodel.machine import fingerprint
from harness.run.matrix import RunFileError, load_run_file

RUN_FILE = """
policies = ["fcfs"]
duration_scale = 0.03
[[knob_sets]]
name = "t1"
torch-threads = 1
[[knob_sets]]
name = "t3"
torch_threads = 3
max-num-seqs = 64
"""


def fit(step_overhead_s: float) -> CostModel:
    return dataclasses.replace(
        CostModel(),
        step_overhead_s=step_overhead_s,
        fitted_at="2026-12-01T00:00:00+00:00",
        fit={"holdout_median_rel_error": 0.02},
    )


def test_each_simulated_cell_uses_the_fit_for_its_own_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    paths = {
        "fcfs-t1": cost_store.save(fit(5e-3), fingerprint("tiny", torch_threads=1)),
        "fcfs-t3": cost_store.save(fit(9e-3), fingerprint("tiny", torch_threads=3)),
    }
    run_file = tmp_path / "threads.toml"
    run_file.write_text(RUN_FILE)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["run", "--simulate", "--run-file", str(run_file), "--no-report", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = [x for x in result.stderr.splitlines() if "cost model:" in x]
    assert sorted(lines) == sorted(
        f"{name}: cost model: {path} (fitted on this machine 2026-12-01T00:00:00+00:00, "
        "held-out median error 2.0%)"
        for name, path in paths.items()
    ), lines
    overheads = {"fcfs-t1": 5e-3, "fcfs-t3": 9e-3}
    threads = {"fcfs-t1": 1, "fcfs-t3": 3}
    root = json.loads((out / "run.json").read_text())
    assert {c["name"]: c["cost_model"] for c in root["cells"]} == {
        n: str(p) for n, p in paths.items()
    }
    assert root["settings"]["cost_model"] is None  # no one model for the whole run
    for name, path in paths.items():
        info = json.loads((out / name / "run.json").read_text())
        summary = json.loads((out / name / "summary.json").read_text())
        assert info["cost_model"] == str(path)
        assert info["settings"] == {"torch_threads": threads[name]}
        assert summary["cost_model"]["step_overhead_s"] == overheads[name]
        assert info["machine"]["torch_threads"] == threads[name]
        assert summary["machine"] == info["machine"]
    assert json.loads((out / "fcfs-t3" / "run.json").read_text())["knobs"]["max_num_seqs"] == 64


def test_cells_of_one_fingerprint_share_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    path = cost_store.save(fit(5e-3), fingerprint("tiny", torch_threads=2))
    run_file = tmp_path / "two.toml"
    run_file.write_text(
        'policies = ["fcfs", "sjf"]\nduration_scale = 0.03\n[knobs]\ntorch-threads = 2\n'
    )
    result = CliRunner().invoke(
        app,
        ["run", "--simulate", "--run-file", str(run_file), "--no-report"]
        + ["--out", str(tmp_path / "run")],
    )
    assert result.exit_code == 0, result.output
    [line] = [x for x in result.stderr.splitlines() if "cost model:" in x]
    assert line.startswith(f"cost model: {path} ")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            '[[knob_sets]]\nname = "g"\nexecutor = "gpu"\n',
            "knob_sets[0].executor: expected torch or sim",
        ),
        ("[knobs]\ntorch-threads = -1\n", "knobs.torch-threads: expected an integer >= 0"),
        ("[knobs]\ntorch-threads = 1.5\n", "knobs.torch-threads: expected an integer >= 0"),
        ("[knobs]\nthreads = 1\n", "nor a run setting (executor, torch-threads)"),
    ],
)
def test_a_bad_run_setting_names_its_key(tmp_path, body, words):
    run_file = tmp_path / "bad.toml"
    run_file.write_text(body)
    with pytest.raises(RunFileError, match=re.escape(words)):
        load_run_file(Path(run_file), {}, ["fcfs"], 1.0, "mixed", 1.0, None)


def test_run_settings_are_the_cells_not_engine_knobs(tmp_path):
    run_file = tmp_path / "set.toml"
    run_file.write_text(
        '[knobs]\nexecutor = "sim"\n[[knob_sets]]\nname = "a"\ntorch-threads = 2\n'
        '[[knob_sets]]\nname = "b"\nexecutor = "torch"\n'
    )
    plan = load_run_file(run_file, {}, ["fcfs"], 1.0, "mixed", 1.0, None)
    settings = {c.name: c.settings for c in plan.cells}
    assert settings == {
        "fcfs-a": {"executor": "sim", "torch_threads": 2},
        "fcfs-b": {"executor": "torch"},
    }
    assert all("executor" not in c.knobs and "torch_threads" not in c.knobs for c in plan.cells)
    assert plan.cells[0].setting("executor", "torch") == "sim"
    assert plan.cells[1].setting("torch_threads", None) is None
