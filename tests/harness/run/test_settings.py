"""What a run's command sets reaches each cell typed (harness/run/settings.py): one
home per default, a setting that cannot be run refused with the flag to blame (exit 2
on the command line), a cell's own settings over the run's, and run.json's record of
them without the API key or a URL's password."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.loadgen.options import GRACE_S, LoadgenOptions
from harness.profiles import resolve_profile
from harness.run.drain import MIN_GRACE_S
from harness.run.plan import plan_run
from harness.run.settings import (
    START_TIMEOUT_S,
    CellMachine,
    CellSettings,
    RunSettings,
    RunSettingsError,
)
from harness.tune.confirm import ConfirmSettings

runner = CliRunner(env={"COLUMNS": "400"})


@pytest.mark.parametrize(
    ("values", "flag", "said"),
    [
        ({"executor": "gpu"}, "--executor", "'gpu': expected torch or sim"),
        ({"target": "127.0.0.1:8000"}, "--target", "expected http://HOST:PORT"),
        ({"target_otlp_port": 4318}, "--target-otlp-port", "only with --target"),
        ({"target_otlp_grpc_port": 4317}, "--target-otlp-grpc-port", "only with --target"),
        (
            {"target": "http://h:1", "target_otlp_port": 70000},
            "--target-otlp-port",
            "70000: not a TCP port",
        ),
        (
            {"target": "http://h:1", "target_otlp_port": 4318, "target_otlp_grpc_port": 4318},
            "--target-otlp-grpc-port",
            "need ports of their own",
        ),
        ({"grace_s": -1.0}, "--grace", "-1: must be >= 0"),
        ({"start_timeout_s": 0.0}, "--start-timeout", "0: must be > 0"),
    ],
)
def test_a_setting_that_cannot_run_is_refused_naming_its_flag(values, flag, said):
    with pytest.raises(RunSettingsError, match=said) as caught:
        RunSettings(**values)
    assert caught.value.flag == flag


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--executor", "gpu"], "--executor"),
        (["--target", "localhost:8000"], "--target"),
        (["--target-otlp-port", "4318"], "--target-otlp-port"),
        (["--grace", "-5"], "--grace"),
        (["--start-timeout", "0"], "--start-timeout"),
    ],
)
def test_the_command_line_exits_2_naming_the_flag(tmp_path, args, said):
    result = runner.invoke(app, ["run", "--out", str(tmp_path / "run"), *args])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_each_default_has_one_home():
    """The command line's, tune's confirmation's and the load generator's defaults are
    the settings' own."""
    defaults = RunSettings()
    # run's grace is each cell's own (harness/run/drain.py) unless --grace gives one;
    # the load generator's own default, and tune's confirmation's, is the minimum of it
    assert defaults.grace_s is None
    assert GRACE_S == LoadgenOptions().grace == MIN_GRACE_S
    assert defaults.start_timeout_s == START_TIMEOUT_S
    confirm = ConfirmSettings()
    assert (confirm.grace_s, confirm.start_timeout_s) == (GRACE_S, START_TIMEOUT_S)
    options = {p.name: p for p in _command("run").params}
    assert options["grace"].default is None
    assert options["start_timeout"].default == START_TIMEOUT_S
    assert options["executor"].default == defaults.executor


def _command(name: str):
    import typer.main

    group = typer.main.get_command(app)
    return group.commands[name]  # type: ignore[attr-defined]


def test_run_json_keeps_every_setting_but_the_key_and_a_password():
    settings = RunSettings(
        target="http://ann:secret@127.0.0.1:8000/",
        api_key="sk-123",
        cost_model=Path("/tmp/model.json"),
        locust_args=["--endpoint", "chat"],
    )
    record = settings.record()
    assert "api_key" not in record
    assert set(record) == {f.name for f in dataclasses.fields(RunSettings)} - {"api_key"}
    assert "secret" not in str(record) and record["target"].startswith("http://ann:")
    assert record["target"].endswith("@127.0.0.1:8000")  # the trailing slash dropped
    assert record["cost_model"] == "/tmp/model.json"
    assert record["locust_args"] == ["--endpoint", "chat"]


def test_a_cell_runs_with_its_own_settings_over_the_run_s():
    plan = plan_run(["fcfs", "sjf"], {}, 1.0, "mixed", 0.1, 7)
    fcfs, sjf = plan.cells
    sjf = dataclasses.replace(sjf, settings={"executor": "sim", "torch_threads": 2})
    run = RunSettings(executor="torch", torch_threads=4, cost_model=Path("shared.json"))
    profile = resolve_profile("mixed").with_duration_scale(0.1)

    def cell_settings(cell, machine):
        return CellSettings.for_cell(
            run,
            cell,
            machine,
            profile_name="mixed",
            profile=profile,
            duration_scale=0.1,
            seed=7,
        )

    mine = cell_settings(sjf, CellMachine({"cpu": "x"}, Path("own.json")))
    assert (mine.executor, mine.torch_threads) == ("sim", 2)
    assert mine.cost_model == Path("own.json") and mine.machine == {"cpu": "x"}
    theirs = cell_settings(fcfs, CellMachine(None, None))
    assert (theirs.executor, theirs.torch_threads, theirs.cost_model) == ("torch", 4, None)
    scheduled, duration = theirs.planned()
    assert scheduled > 0 and duration > 0
    bad = dataclasses.replace(fcfs, settings={"executor": "gpu"})
    with pytest.raises(RunSettingsError):
        cell_settings(bad, CellMachine())


def test_the_old_cell_module_still_answers_with_a_warning():
    import harness.run.cell as old
    from harness.run.cell_result import CellResult

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert old.CellResult is CellResult
    assert any("harness.run.cell_result.CellResult" in str(w.message) for w in caught)
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018


@pytest.mark.parametrize(("args", "keep"), [([], False), (["--keep-off-speed-sources"], True)])
def test_keep_off_speed_sources_reaches_every_cell_s_settings(tmp_path, monkeypatch, args, keep):
    """``--keep-off-speed-sources``: a served cell's refit keeps the pool's sources whose
    steps ran off its speed (harness/costmodel/evidence.py); off by default."""
    import harness.run

    seen = []

    def stand_in_run(options, console):
        seen.append(options.settings)
        return 0, None, tmp_path / "run"

    monkeypatch.setattr(harness.run, "run_matrix", stand_in_run)
    result = runner.invoke(
        app, ["run", "--out", str(tmp_path / "run"), "--policy", "fcfs", "--no-report", *args]
    )
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.keep_off_speed_sources is keep
    assert settings.record()["keep_off_speed_sources"] is keep
    assert RunSettings().keep_off_speed_sources is False
