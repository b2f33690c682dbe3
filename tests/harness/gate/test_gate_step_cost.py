"""The gate's step-cost line (harness/gate/step_cost.py) and its regression kind
(harness/gate/diagnosis.py), on step records whose cycles a known cost model sets.

Each synthetic run is a steps.parquet of random batches (prefill chunks, decode batches
of every size, long and short contexts); a step's cycle is the built-in cost model's
price of its batch times the run's speed and a per-step noise (lognormal). So the truth
is known: a side whose speed is 1.1 has steps 10% slower, whatever batches it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from engine.core.cost_model import CostModel, step_features
from harness.cli import app
from harness.gate.config import GateConfigError, parse_config
from harness.gate.diagnosis import BOTH, NONE, SCHEDULING, STEP, UNKNOWN, diagnose
from harness.gate.evaluate import Check
from harness.gate.gate import run_gate
from harness.gate.sides import GateInputError, Side
from harness.gate.step_cost import (
    MIN_CYCLES,
    StepRuns,
    read_step_runs,
    simulated_latency,
    step_cost_change,
)
from tests.support.gate_runs import requests_frame, write_run

PRICE = np.array(CostModel().coefficients)
BOOT = {"confidence": 0.95, "resamples": 400, "num_blocks": 20, "seed": 7}


def steps_frame(
    rng: np.random.Generator,
    n: int,
    speed: float,
    noise: float = 0.05,
    decode_batch: int = 16,
    drift: float = 0.0,
    t0: float | None = None,
    wobble=None,
) -> pl.DataFrame:
    """``n`` steps of random batches (decode batches around ``decode_batch``), each cycle
    the built-in price x ``speed`` x lognormal(``noise``), the speed drifting linearly by
    ``drift`` over the run and, with ``wobble`` (a function of the clock), by the
    machine's speed at each instant; the first step at ``t0`` (default: a random instant,
    so that two runs do not overlap in time)."""
    prefill = np.where(rng.random(n) < 0.3, rng.integers(16, 512, n), 0)
    decodes = rng.integers(max(1, decode_batch // 2), decode_batch * 2, n)
    context = decodes * rng.integers(64, 900, n)
    work = prefill * prefill // 2
    features = np.array(
        [
            step_features(int(p), int(d), int(c), int(w))
            for p, d, c, w in zip(prefill, decodes, context, work, strict=True)
        ]
    )
    trend = 1.0 + drift * np.linspace(0, 1, n)
    cycles = features @ PRICE * speed * trend * rng.lognormal(0.0, noise, n)
    t0 = float(rng.uniform(0, 1e7)) if t0 is None else t0
    if wobble is not None:  # each step at the machine's speed of its instant
        clock = t0
        for i in range(n):
            cycles[i] *= wobble(clock)
            clock += cycles[i]
    start = t0 + np.concatenate([[0.0], np.cumsum(cycles)])
    return pl.DataFrame(
        {
            "step": np.arange(n + 1),
            "schedule_start": start,
            "idle_before_s": np.zeros(n + 1),
            "num_seqs": np.append(decodes + (prefill > 0), 1),
            "num_prefill_tokens": np.append(prefill, 0),
            "num_decode_seqs": np.append(decodes, 1),
            "num_decode_context_tokens": np.append(context, 100),
            "prefill_attention_work": np.append(work, 0),
            "num_blocks_swapped_out": np.zeros(n + 1, dtype=np.int64),
            "num_blocks_swapped_in": np.zeros(n + 1, dtype=np.int64),
        }
    )


def side_runs(tmp_path: Path, name: str, frames: list[pl.DataFrame]) -> StepRuns:
    paths = []
    for i, frame in enumerate(frames):
        path = tmp_path / f"{name}-{i}.parquet"
        frame.write_parquet(path)
        paths.append(path)
    return read_step_runs(paths)


def test_a_ten_percent_slower_engine_is_seen_and_sized(tmp_path):
    rng = np.random.default_rng(1)
    base = side_runs(tmp_path, "b", [steps_frame(rng, 3000, 1.0)])
    cur = side_runs(tmp_path, "c", [steps_frame(rng, 3000, 1.10)])
    result = step_cost_change(base, cur, **BOOT)
    assert result.change == pytest.approx(0.10, abs=0.01)
    assert 0.05 < result.interval[0] < 0.10 < result.interval[1] < 0.15
    assert result.runs_drawn == "one run a side"


def test_the_same_engine_shows_no_change_within_its_interval(tmp_path):
    rng = np.random.default_rng(2)
    base = side_runs(tmp_path, "b", [steps_frame(rng, 3000, 1.0)])
    cur = side_runs(tmp_path, "c", [steps_frame(rng, 3000, 1.0)])
    result = step_cost_change(base, cur, **BOOT)
    assert result.interval[0] <= 0.0 <= result.interval[1]
    assert abs(result.change) < 0.01


def test_a_different_batch_mix_at_the_same_step_costs_is_no_step_cost_change(tmp_path):
    """A scheduling change batches differently (here: decode batches 4x as large): priced
    by one reference model, the steps cost what they did."""
    rng = np.random.default_rng(3)
    base = side_runs(tmp_path, "b", [steps_frame(rng, 3000, 1.0, decode_batch=4)])
    cur = side_runs(tmp_path, "c", [steps_frame(rng, 3000, 1.0, decode_batch=16)])
    result = step_cost_change(base, cur, **BOOT)
    assert result.interval[0] <= 0.0 <= result.interval[1], result
    # the raw mean cycle differs by far more: that is the batch mix, not the steps
    assert cur.all_cycles().mean() > 1.3 * base.all_cycles().mean()


def test_interleaved_runs_are_drawn_paired_so_shared_drift_cancels(tmp_path):
    """Three runs a side, run i of both sides at the machine's speed of its moment (0.8,
    1.0, 1.25): drawn paired, the interval of a 10% slowdown excludes 0; drawn
    independently (a side with a run fewer), the drift swamps it."""
    rng = np.random.default_rng(4)
    speeds = (0.8, 1.0, 1.25)
    base = side_runs(tmp_path, "b", [steps_frame(rng, 1500, s) for s in speeds])
    cur = side_runs(tmp_path, "c", [steps_frame(rng, 1500, 1.1 * s) for s in speeds])
    paired = step_cost_change(base, cur, **BOOT)
    assert paired.runs_drawn == "paired"
    assert paired.interval[0] > 0.05, paired
    fewer = side_runs(tmp_path, "c2", [steps_frame(rng, 1500, 1.1 * s) for s in speeds[:2]])
    unpaired = step_cost_change(base, fewer, **BOOT)
    assert unpaired.runs_drawn == "independent"
    assert unpaired.interval[0] < 0.0 < unpaired.interval[1], unpaired


def test_side_by_side_runs_share_the_machines_wobble_and_it_cancels(tmp_path):
    """Two servers at once on one machine whose speed swings 0.8-1.25x every few seconds:
    windows of the wall clock pair their steps, so a 10% slowdown stands out; the same
    runs made one after the other (each meeting other swings) cannot tell it."""
    rng = np.random.default_rng(8)

    def wobble(t: float) -> float:
        return 1.0 + 0.22 * np.sin(t / 1.7) + 0.1 * np.sin(t / 0.43)

    # the second server's first step 2.5 s after the first's: windows of the wall clock,
    # not of each run's own time, pair what ran at the same instant
    together = [
        steps_frame(rng, 3000, s, 0.05, t0=t0, wobble=wobble)
        for s, t0 in ((1, 1000), (1.1, 1002.5))
    ]
    base, cur = (side_runs(tmp_path, f"t{i}", [f]) for i, f in enumerate(together))
    paired = step_cost_change(base, cur, **BOOT)
    assert paired.runs_drawn == "side by side, one run a side"
    assert paired.interval[0] > 0.07 and paired.interval[1] < 0.13, paired
    apart = [steps_frame(rng, 3000, s, 0.05, t0=t0, wobble=wobble) for s, t0 in ((1, 0), (1.1, 40))]
    base, cur = (side_runs(tmp_path, f"a{i}", [f]) for i, f in enumerate(apart))
    alone = step_cost_change(base, cur, **BOOT)
    assert alone.runs_drawn == "one run a side"
    assert alone.interval[1] - alone.interval[0] > 2 * (paired.interval[1] - paired.interval[0])


def test_false_alarms_stay_rare_over_many_same_engine_pairs(tmp_path):
    """40 same-engine pairs with per-step noise and a drift inside each run: an interval
    lies wholly above 0 (a false alarm at tolerance 0) in at most 3 (a 95% interval's
    one-sided miss rate is 2.5%: 1 expected; 3 or fewer with probability 0.92)."""
    rng = np.random.default_rng(5)
    alarms = 0
    for i in range(40):
        base = side_runs(tmp_path, f"b{i}", [steps_frame(rng, 800, 1.0, 0.1, drift=0.1)])
        cur = side_runs(tmp_path, f"c{i}", [steps_frame(rng, 800, 1.0, 0.1, drift=0.1)])
        alarms += step_cost_change(base, cur, **BOOT).interval[0] > 0
    assert alarms <= 3


def test_too_few_steps_are_refused(tmp_path):
    rng = np.random.default_rng(6)
    base = side_runs(tmp_path, "b", [steps_frame(rng, MIN_CYCLES // 2, 1.0)])
    cur = side_runs(tmp_path, "c", [steps_frame(rng, 3000, 1.0)])
    with pytest.raises(GateInputError, match="the baseline has .* usable step cycles"):
        step_cost_change(base, cur, **BOOT)


def test_records_without_a_fit_column_are_refused(tmp_path):
    path = tmp_path / "steps.parquet"
    steps_frame(np.random.default_rng(0), 300, 1.0).drop("idle_before_s").write_parquet(path)
    with pytest.raises(GateInputError, match="lack the columns \\['idle_before_s'\\]"):
        read_step_runs([path])


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"percentile": 95}, "takes max_regression only"),
        ({"max": 1.0}, "takes max_regression only"),
        ({"class": "short_chat"}, "not of a class"),
    ],
)
def test_a_step_cost_rule_takes_a_relative_tolerance_only(extra, says):
    with pytest.raises(GateConfigError, match=says):
        parse_config({"rule": [{"metric": "step_cost", "max_regression": 0.05, **extra}]})


# -- the regression kind --------------------------------------------------------------


def check(metric: str, passed: bool, cell: str = "fcfs", **kw) -> Check:
    return Check(
        rule=metric, cell=cell, klass="all", metric=metric, kind="regression", limit=0.1,
        baseline=1.0, current=1.5, change=kw.get("change", 0.5),
        interval=kw.get("interval", (0.3, 0.7)), method="bootstrap", passed=passed,
        message="",
    )  # fmt: skip


def real_side() -> Side:
    return Side("x", Path("x"), "requests", "serve", {}, {})


def test_kinds_of_regression():
    side = real_side()
    assert diagnose([check("step_cost", True), check("e2e p95", True)], side, side).kind == NONE
    scheduling = diagnose([check("step_cost", True), check("e2e p95", False)], side, side)
    assert scheduling.kind == SCHEDULING
    assert "failed while the cell's steps cost the same" in scheduling.lines[0]
    # a latency line of a cell without a step-cost line says it cannot tell
    unknown = diagnose([check("e2e p95", False)], side, side)
    assert unknown.kind == UNKNOWN and "no step-cost line" in unknown.lines[0]
    simulated = Side("x", Path("x"), "requests", "simulate", {}, {})
    assert diagnose([check("e2e p95", False)], simulated, simulated).kind == SCHEDULING


def test_slower_steps_alone_and_beside_a_worse_schedule(monkeypatch):
    """With the step-cost line failed, a latency line is the steps' when the simulator,
    from each side's steps, explains it, and both when it lies beyond that."""
    from harness.gate import diagnosis

    side = real_side()
    # the simulator says the step costs alone move e2e p95 by +40%
    monkeypatch.setattr(
        diagnosis, "_simulated_figures", lambda *a: {"all": {"e2e_p95": (1.0, 1.4)}}
    )
    explained = diagnose([check("step_cost", False), check("e2e p95", False)], side, side)
    assert explained.kind == STEP, explained
    assert any("e2e p95 1.000 s -> 1.400 s (+40.0%)" in line for line in explained.lines)
    assert any("explain +40.0%" in line for line in explained.lines)
    beyond = check("e2e p95", False, change=1.2, interval=(0.9, 1.5))
    both = diagnose([check("step_cost", False), beyond], side, side)
    assert both.kind == BOTH and any("the rest is the schedule" in x for x in both.lines)
    # a scheduling regression in another cell whose steps cost the same: both
    other = [check("step_cost", True, cell="sjf"), check("e2e p95", False, cell="sjf")]
    assert diagnose([check("step_cost", False), *other], side, side).kind == BOTH


# -- through the gate -----------------------------------------------------------------


STEP_RULES = """
[[rule]]
name = "steps"
metric = "step_cost"
max_regression = 0.03
"""


def run_with_steps(root: Path, speed: float | None, seed: int) -> Path:
    """A served run directory of one cell whose steps ran at ``speed`` (None: no step
    records, as a --target run)."""
    run = write_run(root, {"fcfs": requests_frame(seed=seed)})
    if speed is not None:
        steps_frame(np.random.default_rng(seed), 2000, speed).write_parquet(
            run / "fcfs" / "steps.parquet"
        )
    return run


def test_the_gate_fails_slower_steps_and_names_the_kind(tmp_path):
    config = tmp_path / "gate.toml"
    config.write_text(STEP_RULES)
    base = run_with_steps(tmp_path / "a", 1.0, seed=1)
    same = run_with_steps(tmp_path / "b", 1.0, seed=2)
    slower = run_with_steps(tmp_path / "c", 1.1, seed=3)
    out = tmp_path / "gate.json"
    args = ["gate", "--baseline", str(base), "--config", str(config), "--json", str(out)]
    passed = CliRunner().invoke(app, [*args, "--current", str(same)])
    assert passed.exit_code == 0, passed.output
    failed = CliRunner().invoke(app, [*args, "--current", str(slower)])
    assert failed.exit_code == 1, failed.output
    assert "regression kind: step cost" in failed.output
    body = json.loads(out.read_text())
    assert body["regression"]["kind"] == STEP
    [line] = body["checks"]
    assert line["metric"] == "step_cost" and line["change"] == pytest.approx(0.10, abs=0.015)


def test_a_step_cost_rule_without_step_records_is_a_usage_error(tmp_path):
    base = run_with_steps(tmp_path / "a", 1.0, seed=1)
    target = run_with_steps(tmp_path / "b", None, seed=2)
    config = parse_config({"rule": [{"metric": "step_cost", "max_regression": 0.03}]})
    with pytest.raises(GateInputError, match="the current .* has none"):
        run_gate(base, target, config)


def test_a_generator_limited_run_is_gated_on_its_steps_only(tmp_path):
    """Its latencies are the load generator's (refused, exit 2), its steps the engine's:
    a gate of step-cost rules alone compares them, and says the run lagged."""
    base = run_with_steps(tmp_path / "a", 1.0, seed=1)
    lagged = write_run(tmp_path / "b", {"fcfs": requests_frame(seed=2)}, generator_limited=True)
    steps_frame(np.random.default_rng(2), 2000, 1.0).write_parquet(
        lagged / "fcfs" / "steps.parquet"
    )
    steps_only = parse_config({"rule": [{"metric": "step_cost", "max_regression": 0.03}]})
    result = run_gate(base, lagged, steps_only)
    assert result.exit_code == 0
    assert any("fcfs generator-limited: its latencies are not compared" in n for n in result.notes)
    with_latency = parse_config(
        {"rule": [{"metric": "ttft", "max_regression": 0.1},
                  {"metric": "step_cost", "max_regression": 0.03}]}
    )  # fmt: skip
    with pytest.raises(GateInputError, match="generator-limited"):
        run_gate(base, lagged, with_latency)


@pytest.mark.parametrize(
    ("fault", "kind"), [("step_slowdown=0.3", STEP), ("sjf_order=reversed", SCHEDULING)]
)
def test_simulated_runs_name_a_planted_step_delay_and_a_broken_order_apart(
    tmp_path, monkeypatch, fault, kind
):
    """Simulated, a step delay planted for a test moves the model's step costs: the kind
    is the steps' (the faults are read from the simulation's summary.json)."""
    from engine.faults import ENV_VAR

    def simulate(out: Path) -> Path:
        args = ["simulate", "--policy", "sjf", "--duration-scale", "0.1", "--seed", "7"]
        result = CliRunner().invoke(app, [*args, "--cost-model", "builtin", "--out", str(out)])
        assert result.exit_code == 0, result.output
        return out

    monkeypatch.delenv(ENV_VAR, raising=False)
    base = simulate(tmp_path / "base")
    monkeypatch.setenv(ENV_VAR, fault)
    changed = simulate(tmp_path / "changed")
    config = parse_config({"rule": [{"class": "*", "metric": "e2e", "max_regression": 0.0}]})
    result = run_gate(base, changed, config)
    assert result.exit_code == 1
    assert result.diagnosis.kind == kind


def test_the_simulator_replays_a_cells_own_schedule_from_a_sides_fit(tmp_path):
    """simulated_latency: a cell's exact schedule, its knobs, a given cost model. With
    the model the cell was simulated with, its own figures come back; with steps twice
    as slow, the latency grows."""
    out = tmp_path / "run"
    args = ["run", "--simulate", "--policy", "fcfs", "--duration-scale", "0.05", "--seed", "3"]
    result = CliRunner().invoke(
        app, [*args, "--cost-model", "builtin", "--no-report", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    cell = out / "fcfs"
    own = pl.read_parquet(cell / "requests.parquet").filter(pl.col("status") == "ok")
    same = simulated_latency(cell, CostModel())
    assert same is not None
    assert same["all"]["e2e_p95"] == pytest.approx(float(own["e2e_s"].quantile(0.95)), rel=0.02)
    slower = simulated_latency(cell, CostModel().at_speed(2.0))
    assert slower is not None and slower["all"]["e2e_p95"] > 1.5 * same["all"]["e2e_p95"]
    assert set(same) == {"all", *own["class"].unique().to_list()}
