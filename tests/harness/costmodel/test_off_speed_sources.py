"""A source of the pool whose steps ran far from the others' speed is left out of the
refit unless asked (harness/costmodel/evidence.py ``Evidence.refit``, ``off_speed``):
a run beside a noisy neighbour, its steps planted 1.5x slower here, would otherwise
price every step of this machine's model slower. The calibration is never left out;
with fewer than three sources there is no median to judge by. A cell's refit says what
it left out (run.json ``cost_fit``, its line), and ``schedscope run
--keep-off-speed-sources`` reaches it."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.sim.cost_fit import usable_cycles
from harness.costmodel import store as cost_store
from harness.costmodel.evidence import (
    CALIBRATION,
    OFF_SPEED_FACTOR,
    RUN,
    Evidence,
    off_speed,
)
from harness.run.matrix import Cell
from harness.run.simulator_check import CheckModel, cell_fingerprint, fit_into_store
from tests.support.lagging_run import MACHINE, lagging_run, relative_error


def source(name: str, kind: str = RUN, speed: float = 1.0, seed: int = 1) -> Evidence:
    """One source of steps priced by MACHINE, every cycle ``speed`` times as long."""
    x, y = usable_cycles(lagging_run(num_steps=400, slowdown=1.0, seed=seed).steps)
    return Evidence.of_source(x, y * speed, name, kind, client_latency_s=1e-3)


def pool_of(*sources: Evidence) -> Evidence:
    pool = Evidence()
    for one in sources:
        pool = pool.plus(one)
    return pool


def test_a_source_planted_1_5x_slower_is_left_out_and_named():
    pool = pool_of(
        source("calibration", CALIBRATION, seed=1),
        source("run1", seed=2),
        source("run2", seed=3),
        source("noisy", speed=1.5, seed=4),
        source("run3", seed=5),
    )
    fitted = pool.refit("tiny")
    assert [s["name"] for s in fitted.fit["sources"]] == ["calibration", "run1", "run2", "run3"]
    (left_out,) = fitted.fit["sources_left_out"]
    assert (left_out["name"], left_out["kind"]) == ("noisy", RUN)
    assert left_out["time_ratio"] / left_out["median_time_ratio"] == pytest.approx(1.5, rel=0.1)
    assert left_out["steps"] == pool.sources[3]["steps"]
    assert relative_error(fitted) < 0.01  # the machine's own prices
    # the store keeps every source: the next refit judges them again
    assert len(pool.sources) == 5


def test_asked_to_keep_them_the_refit_fits_every_source_and_says_which_were_off():
    pool = pool_of(
        source("calibration", CALIBRATION, seed=1),
        source("run1", seed=2),
        source("noisy", speed=1.5, seed=4),
    )
    kept = pool.refit("tiny", keep_off_speed=True)
    assert [s["name"] for s in kept.fit["sources"]] == ["calibration", "run1", "noisy"]
    assert [s["name"] for s in kept.fit["off_speed_sources_kept"]] == ["noisy"]
    assert "sources_left_out" not in kept.fit
    assert relative_error(kept) > 0.1  # priced slower by the noisy run's steps
    assert [s["name"] for s in pool.refit("tiny").fit["sources_left_out"]] == ["noisy"]


def test_the_calibration_is_never_left_out():
    pool = pool_of(
        source("calibration", CALIBRATION, speed=1.5, seed=1),
        source("run1", seed=2),
        source("run2", seed=3),
    )
    fitted = pool.refit("tiny")
    assert fitted.fit["sources_left_out"] == []
    assert [s["name"] for s in fitted.fit["sources"]] == ["calibration", "run1", "run2"]


def test_with_fewer_than_three_sources_none_is_left_out():
    pool = pool_of(source("calibration", CALIBRATION, seed=1), source("noisy", speed=1.5, seed=4))
    assert pool.refit("tiny").fit["sources_left_out"] == []


@pytest.mark.parametrize(
    ("ratios", "off"),
    [
        ([1.0, 1.0, 1.0], []),
        ([1.0, 1.0, OFF_SPEED_FACTOR * 0.99], []),
        ([1.0, 1.0, OFF_SPEED_FACTOR * 1.01], [2]),
        ([1.0, 1.0, 1 / (OFF_SPEED_FACTOR * 1.01)], [2]),
        ([1.0, 2.0, None, 1.0], [1]),  # a source without a ratio is not judged
        ([1.0, 2.0, None], []),  # and does not count towards the three
    ],
)
def test_the_band_is_around_the_median_of_the_sources_ratios(ratios, off):
    sources = [{"kind": RUN, "time_ratio": r} for r in ratios]
    found, median = off_speed(sources)
    assert found == off
    if median is not None:
        assert median == float(np.median([r for r in ratios if r is not None]))


def _refit_cell(tmp_path, monkeypatch, keep: bool) -> tuple[dict, list[str], str]:
    """A pool of a calibration and two runs in the store; then a cell whose steps ran
    1.5x slow refits it. (entry, the lines shown, the cell's name in the pool)."""
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    pool = pool_of(
        source("calibration", CALIBRATION, seed=1), source("run1", seed=2), source("run2", seed=3)
    )
    cost_store.save(pool.refit("tiny"), machine, evidence=pool)
    cell_dir = tmp_path / "fcfs"
    cell_dir.mkdir()
    slow = lagging_run(num_steps=400, slowdown=1.5, lagging=(0.0, 1.0), seed=4).steps
    slow.write_parquet(cell_dir / "steps.parquet")
    check = CheckModel(MACHINE, None, machine, datetime.now(UTC), "")
    shown: list[str] = []
    entry = fit_into_store(
        Cell("fcfs", "fcfs", None, 1.0, {}, EngineConfig()),
        check,
        cell_dir,
        shown.append,
        keep_off_speed_sources=keep,
    )
    return entry, shown, str(cell_dir)


def test_a_cell_s_refit_names_the_sources_it_left_out_in_run_json_and_its_line(
    tmp_path, monkeypatch
):
    entry, shown, cell = _refit_cell(tmp_path, monkeypatch, keep=False)
    assert [s["name"] for s in entry["sources_left_out"]] == [cell]
    assert [s["name"] for s in entry["sources"]] == ["calibration", "run1", "run2"]
    assert entry["off_speed_sources_kept"] == []
    assert "from 3 of 4 source(s) of step cycles, this cell's left out" in shown[0], shown
    assert f"left out, off the pool's speed: run {cell} (its steps took 1." in shown[0]
    assert "(--keep-off-speed-sources keeps them)" in shown[0]
    stored = cost_store.find(cell_fingerprint(EngineConfig(), "sim", 1)).match.model
    assert relative_error(stored) < 0.01


def test_a_cell_s_refit_asked_to_keep_them_fits_them_and_says_so(tmp_path, monkeypatch):
    entry, shown, cell = _refit_cell(tmp_path, monkeypatch, keep=True)
    assert entry["sources_left_out"] == []
    assert [s["name"] for s in entry["off_speed_sources_kept"]] == [cell]
    assert "from 4 of 4 source(s) of step cycles, this cell's included" in shown[0]
    assert "kept as asked, though off the pool's speed" in shown[0]


def test_a_served_cell_passes_the_run_s_choice_to_its_refit(monkeypatch):
    from harness.run import load_cell, simulator_check

    asked = []

    def refit(*args, keep_off_speed_sources=False, **kwargs):
        asked.append(keep_off_speed_sources)
        return {}

    monkeypatch.setattr(simulator_check, "simulate_counterpart", lambda *a, **k: {})
    monkeypatch.setattr(simulator_check, "fit_into_store", refit)
    for keep in (False, True):
        settings = SimpleNamespace(
            simulator_check=object(), profile=None, seed=None, keep_off_speed_sources=keep
        )
        run = SimpleNamespace(
            settings=settings,
            cell=None,
            cell_dir=None,
            show=print,
            info={},
            result=SimpleNamespace(warnings=[]),
        )
        load_cell._check_simulator(run)
        assert run.result.warnings == [] and simulator_check.COST_FIT_KEY in run.info
    assert asked == [False, True]
