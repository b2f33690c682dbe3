"""The speed band (docs/simulator.md, "The speed band"): when this machine's fit has seen
its steps run at different speeds, `schedscope simulate` simulates the same schedule at
the slowest and fastest of them and reports TTFT and E2E p50/p95 as a range."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import FEATURES, CostModel, CostModelError
from harness.cli import app
from harness.costmodel import store as cost_store
from harness.costmodel.machine import fingerprint
from harness.profiles import resolve_profile
from harness.simulate.driver import run_simulations
from harness.simulate.speed_band import SUMMARY_KEY, observed_speeds

runner = CliRunner()


def pooled(*ratios: float) -> CostModel:
    """A fit whose sources' steps took ``ratios`` times its price."""
    sources = [
        {"name": f"/runs/{i}", "kind": "run", "steps": 1000, "time_ratio": r}
        for i, r in enumerate(ratios)
    ]
    return dataclasses.replace(
        CostModel(),
        step_overhead_s=4e-3,
        fitted_at="2026-12-01T00:00:00+00:00",
        source="steps",
        fit={"holdout_median_rel_error": 0.05, "sources": sources},
    )


@given(
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=len(FEATURES), max_size=len(FEATURES)),
    st.floats(0.05, 20),
)
def test_at_speed_scales_every_step_cost_and_keeps_the_client_latency(features, ratio):
    # every coefficient non-zero, so a term left unscaled shows
    model = CostModel.from_coefficients([1e-4 * (i + 1) for i in range(len(FEATURES))])
    scaled = model.at_speed(ratio)
    for i, name in enumerate(FEATURES):
        assert getattr(scaled, name) == pytest.approx(ratio * 1e-4 * (i + 1), rel=1e-12)
    assert scaled.predict_features(features) == pytest.approx(
        ratio * model.predict_features(features), rel=1e-9, abs=1e-15
    )
    assert scaled.client_latency_s == model.client_latency_s


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("nan"), float("inf")])
def test_at_speed_refuses_a_ratio_that_is_not_a_speed(ratio):
    with pytest.raises(CostModelError, match="time_ratio"):
        CostModel().at_speed(ratio)


def test_speeds_need_two_sources():
    assert observed_speeds(CostModel()) is None
    assert observed_speeds(pooled(1.1)) is None
    speeds = observed_speeds(pooled(1.1, 0.9, 1.3))
    assert (speeds.fastest, speeds.slowest, speeds.sources) == (0.9, 1.3, 3)


def _run(model, out, speed_band=True):
    config = EngineConfig(scheduler=SchedulerConfig(scheduling_policy="fcfs"))
    return run_simulations(
        resolve_profile("default"),
        {"fcfs": config},
        model,
        out,
        num_requests=60,
        write_decisions=False,
        speed_band=speed_band,
    )


def test_the_band_is_the_same_schedule_simulated_at_each_end(tmp_path):
    model = pooled(0.8, 1.25)
    summary = _run(model, tmp_path / "band")
    entry = summary[SUMMARY_KEY]
    assert entry["time_ratios"] == {"fastest": 0.8, "slowest": 1.25}
    assert entry["sources"] == 2
    # Each end is exactly what a plain simulation with the scaled model gives.
    for end, ratio in entry["time_ratios"].items():
        alone = _run(model.at_speed(ratio), tmp_path / end, speed_band=False)
        for group, got in entry["policies"]["fcfs"].items():
            want = alone["policies"]["fcfs"]
            metrics = want["overall" if group == "all" else "classes"]
            metrics = metrics if group == "all" else metrics[group]
            for metric in ("ttft_s", "e2e_s"):
                for stat in ("p50", "p95"):
                    assert got[metric][stat][end] == metrics["metrics"][metric][stat]
    # Slower steps, later tokens: the model's own figure lies between the ends.
    own = summary["policies"]["fcfs"]["overall"]["metrics"]["e2e_s"]["p50"]
    e2e = entry["policies"]["fcfs"]["all"]["e2e_s"]["p50"]
    assert e2e["fastest"] < own < e2e["slowest"]
    on_disk = json.loads((tmp_path / "band" / "summary.json").read_text())
    assert on_disk[SUMMARY_KEY] == entry


def test_no_band_without_an_observed_range_or_when_not_asked(tmp_path):
    assert SUMMARY_KEY not in _run(pooled(1.1), tmp_path / "one")
    assert SUMMARY_KEY not in _run(pooled(0.8, 1.25), tmp_path / "off", speed_band=False)


@pytest.fixture
def store(tmp_path, monkeypatch):
    directory = tmp_path / "store"
    monkeypatch.setenv(cost_store.STORE_ENV, str(directory))
    return directory


def _simulate_cli(tmp_path, *extra):
    out = tmp_path / "sim"
    result = runner.invoke(
        app,
        ["simulate", "--num-requests", "40", "--no-decisions", "--out", str(out), *extra],
    )
    assert result.exit_code == 0, result.output
    return result.stdout, json.loads((out / "summary.json").read_text())


def test_simulate_prints_the_band_of_this_machines_fit(store, tmp_path):
    cost_store.save(pooled(0.88, 1.27), fingerprint("tiny"))
    stdout, summary = _simulate_cli(tmp_path)
    assert "speed band" in stdout
    assert "0.88x and 1.27x" in stdout
    e2e = summary[SUMMARY_KEY]["policies"]["fcfs"]["all"]["e2e_s"]["p95"]
    own = summary["policies"]["fcfs"]["overall"]["metrics"]["e2e_s"]["p95"]
    assert f"{own:.3f} ({e2e['fastest']:.3f}-{e2e['slowest']:.3f})" in stdout


def test_simulate_without_the_band(store, tmp_path):
    cost_store.save(pooled(0.88, 1.27), fingerprint("tiny"))
    stdout, summary = _simulate_cli(tmp_path, "--no-speed-band")
    assert "speed band" not in stdout
    assert SUMMARY_KEY not in summary


def test_a_ratio_that_is_not_a_speed_is_left_out_not_a_crash(store, tmp_path):
    # a hand-edited store file: 0 and a negative ratio are no speeds; two good ones remain
    cost_store.save(pooled(0.0, 0.9, -1.0, 1.1), fingerprint("tiny"))
    _, summary = _simulate_cli(tmp_path)
    assert summary[SUMMARY_KEY]["time_ratios"] == {"fastest": 0.9, "slowest": 1.1}
    assert summary[SUMMARY_KEY]["sources"] == 2


@pytest.mark.parametrize("policies", [["fcfs"], ["fcfs", "sjf"]])
def test_the_report_of_a_simulation_shows_its_band(tmp_path, policies):
    from harness.report import ReportOptions, generate_report

    configs = {p: EngineConfig(scheduler=SchedulerConfig(scheduling_policy=p)) for p in policies}
    out = tmp_path / "sim"
    summary = run_simulations(
        resolve_profile("default"),
        configs,
        pooled(0.8, 1.25),
        out,
        num_requests=40,
        write_decisions=False,
        speed_band=True,
    )
    paths = generate_report([out], tmp_path / "report", ReportOptions(figures=False, resamples=20))
    md = paths["markdown"].read_text()
    assert "## Speed band" in md
    for policy in policies:
        ends = summary[SUMMARY_KEY]["policies"][policy]["all"]["e2e_s"]["p95"]
        low, high = ends["fastest"], ends["slowest"]
        text = lambda v: f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"  # noqa: E731
        assert f"| sim | {policy} | all | " in md
        assert f"{text(low)} – {text(high)} |" in md
    assert 'id="speed-band"' in paths["html"].read_text()


def test_no_band_section_without_a_band(tmp_path):
    from harness.report import ReportOptions, generate_report

    out = tmp_path / "sim"
    _run(pooled(1.1), out)
    paths = generate_report([out], tmp_path / "report", ReportOptions(figures=False, resamples=20))
    assert "Speed band" not in paths["markdown"].read_text()


def test_a_banded_simulation_is_the_same_bytes_every_time(tmp_path):
    model = pooled(0.8, 1.25)
    _run(model, tmp_path / "a")
    _run(model, tmp_path / "b")
    first = (tmp_path / "a" / "summary.json").read_bytes()
    assert SUMMARY_KEY.encode() in first
    assert first == (tmp_path / "b" / "summary.json").read_bytes()
