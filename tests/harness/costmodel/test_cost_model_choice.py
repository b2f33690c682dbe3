"""Which cost model `schedscope simulate` uses and the one stderr line that says so:
this machine's stored fit, else the built-in with a warning that names the fix; a
stale fit is named and not used; `--cost-model builtin`, `auto` and FILE as documented
(docs/simulator.md); `schedscope calibrate --show` lists the store."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from engine.core.cost_model import CostModel
from harness.cli import app
from harness.costmodel import store as cost_store
from harness.costmodel.choice import AUTO, BUILTIN, choose
from harness.costmodel.machine import fingerprint

runner = CliRunner()


@pytest.fixture
def store(tmp_path, monkeypatch):
    directory = tmp_path / "store"
    monkeypatch.setenv(cost_store.STORE_ENV, str(directory))
    return directory


def fitted(step_overhead_s: float = 7e-3, error: float = 0.031) -> CostModel:
    return dataclasses.replace(
        CostModel(),
        step_overhead_s=step_overhead_s,
        fitted_at="2026-12-01T00:00:00+00:00",
        source="steps",
        fit={"holdout_median_rel_error": error},
    )


def simulate(tmp_path, *extra: str):
    out = tmp_path / "sim"
    result = runner.invoke(
        app, ["simulate", "--num-requests", "20", "--no-decisions", "--out", str(out), *extra]
    )
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "summary.json").read_text())


def cost_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("cost model:")]


def test_this_machines_stored_fit_is_used_and_named(store, tmp_path):
    path = cost_store.save(fitted(), fingerprint("tiny"))
    result, summary = simulate(tmp_path)
    assert cost_lines(result) == [
        f"cost model: {path} (fitted on this machine 2026-12-01T00:00:00+00:00, "
        "held-out median error 3.1%)"
    ]
    assert summary["cost_model"]["step_overhead_s"] == 7e-3
    assert summary["machine"] == fingerprint("tiny").to_dict()
    assert path.name not in result.stdout  # the line is on stderr only


def test_without_a_fit_the_builtin_is_used_with_a_warning_naming_the_fix(store, tmp_path):
    cost_store.save(fitted(), fingerprint("tiny", cpu_model="another CPU"))
    result, summary = simulate(tmp_path)
    [line] = cost_lines(result)
    assert "built-in, fitted on another machine" in line
    assert "off by a large factor" in line and "3-4x" in line
    assert "`schedscope calibrate`" in line
    assert summary["cost_model"] == CostModel().to_dict()


@pytest.mark.parametrize("change", [{"schedscope": "0.0.1"}, {"model_config": "0123456789ab"}])
def test_a_stale_fit_is_named_not_used(store, tmp_path, change):
    path = cost_store.save(fitted(), fingerprint("tiny", **change))
    result, summary = simulate(tmp_path)
    [line] = cost_lines(result)
    assert f"{path} is stale" in line and "refit with `schedscope calibrate`" in line
    assert next(iter(change)) in line
    assert summary["cost_model"] == CostModel().to_dict()


def test_builtin_uses_the_builtin_even_with_a_fit_and_says_so_once(store, tmp_path):
    cost_store.save(fitted(), fingerprint("tiny"))
    result, summary = simulate(tmp_path, "--cost-model", "builtin")
    assert cost_lines(result) == [
        "cost model: built-in, fitted on another machine (x86_64, 2 cores, 1 torch thread, "
        "torch 2.13 CPU build, model tiny fp32) (--cost-model builtin)"
    ]
    assert summary["cost_model"] == CostModel().to_dict()


def test_a_file_is_used_as_before_without_a_line(store, tmp_path):
    cost_store.save(fitted(), fingerprint("tiny"))
    file = tmp_path / "auto"  # a file named like a choice, given as a path
    fitted(step_overhead_s=9e-3).save(file)
    result, summary = simulate(tmp_path, "--cost-model", str(file))
    assert cost_lines(result) == []
    assert summary["cost_model"]["step_overhead_s"] == 9e-3
    bad = runner.invoke(app, ["simulate", "--cost-model", str(tmp_path / "nope.json")])
    assert bad.exit_code == 2 and "cost model file not found" in bad.output


def test_auto_calibrates_when_there_is_no_fit_then_finds_it(store):
    machine = fingerprint("tiny")
    calls = []

    def calibrate(for_machine):
        calls.append(for_machine)
        return fitted(step_overhead_s=4e-3, error=0.05)

    stale = cost_store.save(fitted(), dataclasses.replace(machine, schedscope="0.0.1"))
    first = choose(AUTO, machine, calibrate=calibrate)
    assert calls == [machine] and first.model.step_overhead_s == 4e-3
    assert first.path == cost_store.path_for(machine)
    assert f"{stale} is stale" in first.line and "calibrated now" in first.line
    assert first.model.fingerprint == machine.to_dict()
    again = choose(AUTO, machine, calibrate=calibrate)
    assert len(calls) == 1 and again.path == first.path and "calibrated" not in again.line
    assert choose(BUILTIN, machine, calibrate=calibrate).path is None and len(calls) == 1


def test_calibrate_show_lists_the_store_against_this_machine(store):
    here = fingerprint("tiny")
    match = cost_store.save(fitted(), here)
    stale = cost_store.save(fitted(), dataclasses.replace(here, schedscope="0.0.1"))
    other = cost_store.save(fitted(), dataclasses.replace(here, cpu_model="another CPU"))
    (store / "broken.json").write_text("[]")
    result = runner.invoke(app, ["calibrate", "--show"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"this machine: {here.describe()}"
    assert str(store) in lines[1]
    by_path = {line.split(": ", 1)[0]: line for line in lines[2:]}
    assert "MATCHES this machine" in by_path[str(match)] and "3.1%" in by_path[str(match)]
    assert "2026-12-01" in by_path[str(match)]
    assert "STALE (schedscope 0.0.1 -> " in by_path[str(stale)]
    assert "differs in cpu_model" in by_path[str(other)]
    assert "unusable" in by_path[str(store / "broken.json")]
    assert not (store / "cost_model.json").exists()


def test_calibrate_show_on_an_empty_store_names_the_fix(store):
    result = runner.invoke(app, ["calibrate", "--show"])
    assert result.exit_code == 0, result.output
    assert "no stored models: `schedscope calibrate`" in result.stdout


@pytest.mark.parametrize(
    ("cal_extra", "run_extra", "cal_said", "run_said"),
    [
        # the held-out error of each source, where the pool knows it
        (
            {"holdout_median_rel_error": 0.04},
            {"holdout_median_rel_error": None},
            ", held-out 4.0%",
            "",
        ),
        # what each source's steps took against the pooled fit's price for them
        (
            {"time_ratio": 0.93},
            {"time_ratio": 1.07},
            ", took 0.93x the price",
            ", took 1.07x the price",
        ),
    ],
)
def test_calibrate_show_names_the_sources_a_pooled_fit_came_from(
    store, cal_extra, run_extra, cal_said, run_said
):
    sources = [
        {"name": "/cal", "kind": "calibration", "steps": 3497, **cal_extra},
        {"name": "/runs/a/fcfs", "kind": "run", "steps": 2519, **run_extra},
    ]
    pooled = dataclasses.replace(
        fitted(), fit={"holdout_median_rel_error": 0.1, "sources": sources}
    )
    path = cost_store.save(pooled, fingerprint("tiny"))
    result = runner.invoke(app, ["calibrate", "--show"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(str(path)))
    assert lines[at + 1] == (
        f"  fitted from the step cycles of calibration /cal (3497 steps{cal_said}); "
        f"run /runs/a/fcfs (2519 steps{run_said})"
    )


def test_calibrate_show_names_the_sources_a_pooled_fit_left_out(store):
    sources = [{"name": "/cal", "kind": "calibration", "steps": 3497, "time_ratio": 0.98}]
    left_out = [
        {
            "name": "/runs/b/sjf",
            "kind": "run",
            "steps": 2100,
            "time_ratio": 1.52,
            "median_time_ratio": 0.98,
        }
    ]
    pooled = dataclasses.replace(
        fitted(),
        fit={"holdout_median_rel_error": 0.1, "sources": sources, "sources_left_out": left_out},
    )
    path = cost_store.save(pooled, fingerprint("tiny"))
    result = runner.invoke(app, ["calibrate", "--show"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(str(path)))
    assert lines[at + 2] == (
        "  left out, off the pool's speed: run /runs/b/sjf (its steps took 1.52x the price, "
        "the sources' median 0.98x)"
    )


@pytest.mark.parametrize("text", ['{"step_overhead_s": NaN}', '{"client_latency_s": Infinity}'])
def test_simulate_and_tune_refuse_a_cost_model_with_a_non_finite_parameter(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "--cost-model", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "finite" in result.output
