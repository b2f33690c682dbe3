"""``schedscope calibrate --from-steps``: the fit is stored under the executor, torch
threads and model the steps ran with, as the run.json beside them records (a
``schedscope run`` cell's, a served calibration's), else as --executor says (then
required); a flag the records contradict, or steps of different executors, is a usage
error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.cli import app
from harness.costmodel.machine import fingerprint
from harness.profiles import resolve_profile
from harness.simulate.driver import run_simulations


@pytest.fixture(scope="module")
def steps_dir(tmp_path_factory) -> Path:
    """A simulated run's steps.parquet (enough steps to fit; no run.json beside it)."""
    out = tmp_path_factory.mktemp("steps")
    run_simulations(
        resolve_profile("default"),
        {"fcfs": EngineConfig(SchedulerConfig(max_num_seqs=32))},
        CostModel(),
        out,
        num_requests=120,
        write_decisions=False,
    )
    return out


def cell(tmp_path: Path, steps_dir: Path, name: str, **record) -> Path:
    """A directory like a run cell's: the steps, and a run.json of ``record``."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "steps.parquet").write_bytes((steps_dir / "steps.parquet").read_bytes())
    if record:
        (directory / "run.json").write_text(json.dumps(record))
    return directory


def calibrate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["calibrate", *args])
    return result.exit_code, " ".join(result.output.replace("│", " ").split())


def fitted_fingerprint(out: Path) -> dict:
    return CostModel.load(out).fingerprint or {}


def test_a_cells_recorded_executor_and_threads_are_the_fits(tmp_path, steps_dir):
    serve = ["-m", "harness.cli", "serve", "--executor", "sim", "--torch-threads", "3"]
    directory = cell(
        tmp_path, steps_dir, "sjf", executor="sim", knobs={"model": "tiny"}, serve_command=serve
    )
    out = tmp_path / "fit.json"
    code, text = calibrate("--from-steps", str(directory), "--out", str(out))
    assert code == 0, text
    assert "the steps ran on the sim executor with 3 torch threads" in text, text
    stored = fitted_fingerprint(out)
    # a record that names no cpu_split was made unpinned
    expected = fingerprint("tiny", executor="sim", torch_threads=3, serve_cores=0)
    assert stored["executor"] == "sim" and stored["torch_threads"] == 3
    assert stored["key"] == expected.key
    # --executor agreeing with the record is accepted
    code, text = calibrate("--from-steps", str(directory), "--executor", "sim", "--out", str(out))
    assert code == 0, text


def test_a_served_calibrations_records_name_their_executor(tmp_path, steps_dir):
    directory = cell(
        tmp_path,
        steps_dir,
        "records",
        kind="schedscope-calibrate",
        executor="sim",
        torch_threads=None,
        model="tiny",
        serve_command=["-m", "harness.cli", "serve", "--executor", "sim"],
    )
    out = tmp_path / "fit.json"
    code, text = calibrate("--from-steps", str(directory / "steps.parquet"), "--out", str(out))
    assert code == 0, text
    assert fitted_fingerprint(out)["key"] == fingerprint("tiny", executor="sim", serve_cores=0).key


def test_the_recorded_cpu_split_is_the_fits(tmp_path, steps_dir):
    """A run whose server was pinned to one core (run.json ``cpu_split``) stands for
    steps served on one core, whatever --cpu-split the refit is given."""
    split = {"serve": [0], "load_generator": [1], "chosen": "auto"}
    directory = cell(tmp_path, steps_dir, "fcfs", executor="sim", cpu_split=split)
    out = tmp_path / "fit.json"
    code, text = calibrate("--from-steps", str(directory), "--cpu-split", "off", "--out", str(out))
    assert code == 0, text
    assert fitted_fingerprint(out)["serve_cores"] == 1
    other = cell(tmp_path, steps_dir, "sjf", executor="sim")
    code, text = calibrate(
        "--from-steps", str(directory), "--from-steps", str(other), "--out", str(out)
    )
    assert code == 2 and "different server cores" in text, text


def test_steps_nothing_describes_need_executor(tmp_path, steps_dir, monkeypatch):
    from harness.costmodel import store as cost_store

    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    out = tmp_path / "fit.json"
    code, text = calibrate("--from-steps", str(steps_dir), "--out", str(out))
    assert code == 2 and "--executor" in text and "give --executor torch or sim" in text, text
    assert not out.exists()
    code, text = calibrate("--from-steps", str(steps_dir), "--executor", "sim", "--out", str(out))
    assert code == 0, text
    assert fitted_fingerprint(out)["executor"] == "sim"
    code, text = calibrate(
        "--from-steps", str(steps_dir), "--executor", "torch", "--torch-threads", "2"
    )
    assert code == 0, text
    # without --out: the store, under the torch executor with 2 threads
    match = cost_store.find(fingerprint("tiny", executor="torch", torch_threads=2)).match
    assert match is not None and match.model is not None and match.model.source == "steps"


@pytest.mark.parametrize(
    ("record", "args", "flag", "words"),
    [
        ({"executor": "sim"}, ["--executor", "torch"], "--executor", "ran on the sim executor"),
        (
            {"executor": "torch", "serve_command": ["serve", "--torch-threads", "1"]},
            ["--torch-threads", "2"],
            "--torch-threads",
            "ran with --torch-threads 1",
        ),
        (
            {"executor": "torch", "knobs": {"model": "small"}},
            [],
            "--model",
            "give --model small",
        ),
        ({"executor": None, "mode": "simulate"}, [], "--executor", "names none"),
        ({"executor": "torch"}, ["--executor", "gpu"], "--executor", "unknown executor"),
    ],
)
def test_a_flag_the_records_contradict_is_refused(tmp_path, steps_dir, record, args, flag, words):
    directory = cell(tmp_path, steps_dir, "c", **record)
    out = tmp_path / "fit.json"
    code, text = calibrate("--from-steps", str(directory), *args, "--out", str(out))
    assert code == 2 and flag in text and words in text, text
    assert not out.exists()


def test_steps_of_different_executors_are_not_fitted_together(tmp_path, steps_dir):
    a = cell(tmp_path, steps_dir, "a", executor="torch")
    b = cell(tmp_path, steps_dir, "b", executor="sim")
    code, text = calibrate("--from-steps", str(a), "--from-steps", str(b))
    assert code == 2 and "--from-steps" in text and "different executors" in text, text
    # one of them described, the other not: the undescribed one needs --executor
    c = cell(tmp_path, steps_dir, "c")
    code, text = calibrate("--from-steps", str(a), "--from-steps", str(c))
    assert code == 2 and "--executor" in text, text
    code, text = calibrate(
        "--from-steps",
        str(a),
        "--from-steps",
        str(c),
        "--executor",
        "torch",
        "--out",
        str(tmp_path / "fit.json"),
    )
    assert code == 0, text
