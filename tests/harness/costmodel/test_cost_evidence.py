"""The step cycles kept beside a stored fit (``harness.costmodel.evidence``), and a served
cell's refit from them (``harness.run.simulator_check.fit_into_store``): a run refines
this machine's model instead of replacing it with a fit of one regime.

The steps are synthetic step records whose cycles a known cost model sets (no server):
a *calibration* of varied batches under one model, a *cell* of one narrow regime
(large decode batches, long contexts) on cores it shares with a load generator, every
step 1.4x as long.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core.cost_model import FEATURES, CostModel
from engine.sim.cost_fit import usable_cycles
from harness.costmodel import evidence as cost_evidence
from harness.costmodel import store as cost_store
from harness.costmodel.evidence import (
    CALIBRATION,
    MAX_RUN_SOURCES,
    MAX_STEPS_PER_SOURCE,
    RUN,
    Evidence,
    EvidenceError,
)
from harness.run.matrix import Cell
from harness.run.simulator_check import CheckModel, cell_fingerprint, fit_into_store

MACHINE = CostModel(
    step_overhead_s=2e-3,
    prefill_token_s=3e-5,
    decode_seq_s=1e-4,
    decode_context_token_s=4e-7,
    prefill_seq_s=1e-3,
    swap_block_s=5e-6,
)
#: The same machine with its cores shared: a `schedscope run` cell whose Locust and API
#: processes take CPU from the engine (measured 2026-12-02 on 2 cores: its steps took
#: 1.25-1.5x what a calibration with a light client predicted).
BUSY = CostModel.from_coefficients(1.4 * c for c in MACHINE.coefficients)


def steps_frame(model: CostModel, shapes: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """Step records (the columns a fit reads) whose cycles ``model`` predicts exactly:
    one row per (prefill tokens, decode seqs, decode context tokens, swapped blocks)."""
    rows, t = [], 0.0
    for step, (prefill, decodes, context, swapped) in enumerate(shapes):
        rows.append(
            {
                "step": step,
                "schedule_start": t,
                "idle_before_s": 0.0,
                "num_seqs": decodes + (1 if prefill else 0),
                "num_prefill_tokens": prefill,
                "num_decode_seqs": decodes,
                "num_decode_context_tokens": context,
                "prefill_attention_work": prefill * prefill,
                "prefill_padded_attention_work": prefill * prefill,
                "num_blocks_swapped_out": swapped,
                "num_blocks_swapped_in": 0,
            }
        )
        t += model.predict(
            prefill, decodes, context, prefill * prefill, swapped, 1 if prefill else 0, prefill**2
        )
    return pl.DataFrame(rows)


def calibration_shapes(n: int = 600, seed: int = 1) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(n):
        decodes = int(rng.integers(0, 64))
        prefill = int(rng.choice([0, 0, 16, 128, 512]))
        if not (decodes or prefill):
            decodes = 1
        shapes.append((prefill, decodes, decodes * int(rng.integers(20, 1500)), 0))
    return shapes


def busy_shapes(n: int = 900, seed: int = 2) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    return [
        (0, d, d * int(rng.integers(900, 1100)), 0) for d in rng.integers(40, 48, size=n).tolist()
    ]


def source(model: CostModel, shapes, kind: str, name: str) -> Evidence:
    x, y = usable_cycles(steps_frame(model, shapes))
    return Evidence.of_source(x, y, name, kind, client_latency_s=1e-3)


def relative_error(model: CostModel, truth: CostModel, shapes) -> float:
    """Median relative error of ``model``'s step times against ``truth``'s."""
    x, _ = usable_cycles(steps_frame(truth, shapes))
    predicted, actual = x @ np.array(model.coefficients), x @ np.array(truth.coefficients)
    return float(np.median(np.abs(predicted - actual) / actual))


def test_a_source_is_thinned_to_its_bound_and_counts_what_it_swapped():
    shapes = [(0, 4, 400, 1 if i % 2 else 0) for i in range(2 * MAX_STEPS_PER_SOURCE + 7)]
    one = source(MACHINE, shapes, RUN, "cell")
    assert len(one) <= MAX_STEPS_PER_SOURCE and len(one) > MAX_STEPS_PER_SOURCE // 2
    assert one.sources[0]["steps"] == len(one) and one.sources[0]["kind"] == RUN
    assert one.sources[0]["swapped_blocks"] > 0
    assert set(one.source.tolist()) == {0}


def test_a_pool_keeps_the_last_calibration_and_the_newest_runs():
    small = calibration_shapes(40)
    pool = source(MACHINE, small, CALIBRATION, "old calibration")
    pool = pool.plus(source(MACHINE, small, RUN, "before"))
    pool = pool.plus(source(MACHINE, small, CALIBRATION, "calibration"))
    for i in range(MAX_RUN_SOURCES + 2):
        pool = pool.plus(source(MACHINE, small, RUN, f"run{i}"))
    names = [s["name"] for s in pool.sources]
    # a calibration starts afresh; the oldest runs go first; the calibration stays
    assert names == ["calibration"] + [f"run{i}" for i in range(2, MAX_RUN_SOURCES + 2)]
    assert len(pool) == sum(s["steps"] for s in pool.sources)
    for i, s in enumerate(pool.sources):
        assert int((pool.source == i).sum()) == s["steps"]


def test_a_pool_round_trips_through_its_file(tmp_path):
    pool = source(MACHINE, calibration_shapes(50), CALIBRATION, "c").plus(
        source(BUSY, busy_shapes(30), RUN, "r")
    )
    path = tmp_path / "pool"  # no suffix: the file is written where it is asked to be
    pool.save(path)
    back = Evidence.load(path)
    assert back.sources == pool.sources
    assert np.array_equal(back.features, pool.features)
    assert np.array_equal(back.cycles, pool.cycles)
    assert np.array_equal(back.source, pool.source)


def test_an_unreadable_or_foreign_pool_is_refused_with_the_reason(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a pool")
    with pytest.raises(EvidenceError, match="not a pool of step cycles"):
        Evidence.load(bad)
    narrow = Evidence(np.zeros((3, len(FEATURES) - 1)), np.ones(3), np.zeros(3, np.int32), [{}])
    narrow.save(tmp_path / "narrow.npz")
    with pytest.raises(EvidenceError, match=f"expected {len(FEATURES)} features"):
        Evidence.load(tmp_path / "narrow.npz")
    unnamed = Evidence(np.zeros((3, len(FEATURES))), np.ones(3), np.zeros(3, np.int32), [{}])
    unnamed.save(tmp_path / "unnamed.npz")
    with pytest.raises(EvidenceError, match="its sources must be objects with"):
        Evidence.load(tmp_path / "unnamed.npz")


@settings(max_examples=25, deadline=None)
@given(kinds=st.lists(st.sampled_from([CALIBRATION, RUN]), min_size=1, max_size=14))
def test_every_row_of_a_pool_belongs_to_a_source_it_lists(kinds):
    pool = Evidence()
    for i, kind in enumerate(kinds):
        pool = pool.plus(source(MACHINE, calibration_shapes(5 + i, seed=i), kind, f"s{i}"))
    assert len(pool.sources) <= MAX_RUN_SOURCES + 1
    assert sum(s["kind"] == CALIBRATION for s in pool.sources) <= 1
    assert pool.source.min() >= 0 and pool.source.max() < len(pool.sources)
    assert len(pool) == sum(s["steps"] for s in pool.sources)


def _cell_dir(tmp_path, model: CostModel, shapes) -> object:
    cell_dir = tmp_path / "fcfs"
    cell_dir.mkdir()
    steps_frame(model, shapes).write_parquet(cell_dir / "steps.parquet")
    return cell_dir


def test_a_cell_refits_the_calibrated_model_instead_of_replacing_it(tmp_path, monkeypatch):
    """The bug it fixes: a served cell of one regime (seen: a tune confirm cell at 1.5x
    capacity, with Locust on the same 2 cores) was stored alone as the machine's model,
    and the next simulation of a light 1x load came out 2-3x slow (40% per step). Now
    the refit pools it with the calibration."""
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    calibration = source(MACHINE, calibration_shapes(), CALIBRATION, "calibration")
    calibrated = calibration.refit("tiny")
    cost_store.save(calibrated, machine, evidence=calibration)
    assert relative_error(calibrated, MACHINE, calibration_shapes(seed=9)) < 0.01

    cell_dir = _cell_dir(tmp_path, BUSY, busy_shapes())
    check = CheckModel(calibrated, None, machine, datetime.now(UTC), "")
    lines: list[str] = []
    entry = fit_into_store(
        Cell("fcfs", "fcfs", None, 1.0, {}, EngineConfig()), check, cell_dir, lines.append
    )
    assert entry["stored"] == str(cost_store.path_for(machine))
    assert [s["kind"] for s in entry["sources"]] == [CALIBRATION, RUN]
    assert any("2 source(s)" in line for line in lines)
    stored = cost_store.find(machine).match.model
    assert stored.fitted_at == entry["fitted_at"] and stored.source == "steps"

    ordinary = calibration_shapes(seed=9)
    # the cell alone: what used to be stored
    alone = source(BUSY, busy_shapes(), RUN, "cell").refit("tiny")
    assert relative_error(alone, MACHINE, ordinary) > 0.3
    # the pooled refit sits between the two: closer to the calibration's steps than the
    # cell alone, and closer to the cell's than the calibration alone
    assert relative_error(stored, MACHINE, ordinary) < 0.25
    busy = busy_shapes(seed=5)
    assert relative_error(stored, BUSY, busy) < relative_error(calibrated, BUSY, busy)
    # the store now keeps both sources for the next cell
    assert [s["name"] for s in cost_store.load_evidence(machine).sources] == [
        "calibration",
        str(cell_dir),
    ]


def test_a_refit_of_steps_that_never_swapped_keeps_the_stored_swap_price(tmp_path, monkeypatch):
    """Before, a cell without swaps stored swap_block_s = 0: swaps looked free to
    ``--preemption-mode auto`` from then on."""
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    prior = dataclasses.replace(MACHINE, swap_block_s=9e-6, fitted_at="2026-01-01T00:00:00+00:00")
    cost_store.save(prior, machine)  # no pool: a profiling calibration, say
    cell_dir = _cell_dir(tmp_path, MACHINE, calibration_shapes())
    check = CheckModel(prior, None, machine, datetime.now(UTC), "")
    entry = fit_into_store(
        Cell("fcfs", "fcfs", None, 1.0, {}, EngineConfig()), check, cell_dir, print
    )
    assert [s["kind"] for s in entry["sources"]] == [RUN]
    assert cost_store.find(machine).match.model.swap_block_s == 9e-6


def test_an_unreadable_pool_is_said_and_the_refit_starts_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    cost_store.save(MACHINE, machine)
    cost_store.evidence_path_for(machine).write_bytes(b"garbage")
    cell_dir = _cell_dir(tmp_path, MACHINE, calibration_shapes())
    check = CheckModel(MACHINE, None, machine, datetime.now(UTC), "")
    entry = fit_into_store(
        Cell("fcfs", "fcfs", None, 1.0, {}, EngineConfig()), check, cell_dir, print
    )
    assert entry["stored"] and [s["kind"] for s in entry["sources"]] == [RUN]
    assert any("unreadable" in note for note in entry["notes"])
    assert len(cost_store.load_evidence(machine).sources) == 1


def test_a_calibration_starts_the_pool_and_a_fit_without_steps_drops_it(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    records = _cell_dir(tmp_path, MACHINE, calibration_shapes())
    served = dataclasses.replace(MACHINE, fit={"served": {"records": str(records)}})
    pool = cost_evidence.of_calibration(served)
    assert pool is not None and [s["kind"] for s in pool.sources] == [CALIBRATION]
    cost_store.save(served, machine, evidence=pool)
    assert cost_store.evidence_path_for(machine).is_file()
    assert cost_evidence.of_calibration(MACHINE) is None  # the profiling sweep: no steps
    cost_store.save(MACHINE, machine)  # a fit that is not of these steps
    assert not cost_store.evidence_path_for(machine).exists()


def test_calibrate_from_steps_into_the_store_starts_its_pool(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.costmodel.machine import fingerprint

    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    records = _cell_dir(tmp_path, MACHINE, calibration_shapes())
    result = CliRunner().invoke(
        app,
        ["calibrate", "--from-steps", str(records), "--executor", "sim", "--torch-threads", "1"],
    )
    assert result.exit_code == 0, result.output
    machine = fingerprint("tiny", executor="sim", torch_threads=1)
    pool = cost_store.load_evidence(machine)
    assert [(s["kind"], s["name"]) for s in pool.sources] == [(CALIBRATION, str(records))]
    assert len(pool) == len(calibration_shapes()) - 1  # every step another follows
    stored = cost_store.find(machine).match.model
    assert relative_error(stored, MACHINE, calibration_shapes(seed=9)) < 0.01


def test_a_pooled_fit_says_how_far_its_sources_speeds_ranged(tmp_path, monkeypatch):
    """The same kinds of steps from two runs, the second on a machine 1.25x slower
    throughout (a VM whose speed wandered between them): each source's ``time_ratio``
    against the pooled fit brackets it, their range is the 1.25x, and the line
    `simulate` prints names it; a fit of one source has no range."""
    slow = CostModel.from_coefficients(1.25 * c for c in MACHINE.coefficients)
    pool = source(MACHINE, calibration_shapes(seed=1), CALIBRATION, "calibration").plus(
        source(slow, calibration_shapes(seed=3), RUN, "slow run")
    )
    fitted = pool.refit("tiny")
    fast_ratio, slow_ratio = (s["time_ratio"] for s in fitted.fit["sources"])
    assert fast_ratio < 1 < slow_ratio
    assert slow_ratio / fast_ratio == pytest.approx(1.25, rel=0.02)
    lowest, highest, count = cost_evidence.speed_range(fitted.fit)
    assert (lowest, highest, count) == (fast_ratio, slow_ratio, 2)
    alone = source(MACHINE, calibration_shapes(), CALIBRATION, "calibration").refit("tiny")
    assert cost_evidence.speed_range(alone.fit) is None

    from harness.costmodel.choice import choose
    from harness.costmodel.machine import fingerprint

    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = fingerprint("tiny")
    cost_store.save(fitted, machine, evidence=pool)
    line = choose(None, machine).line
    assert f"its 2 sources' steps took {fast_ratio:.2f}-{slow_ratio:.2f}x its price" in line
    cost_store.save(alone, machine)
    assert "sources' steps took" not in choose(None, machine).line
