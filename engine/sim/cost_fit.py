"""Fitting the cost model's parameters to measured step times (numpy only, no torch).

Two sources of measurements, one fit:

- profiling the model runner over a grid of step shapes (``engine.sim.calibration``);
- the step records of a real run (``steps.parquet``, from ``schedscope serve
  --record-steps`` or any run directory): each step's full *cycle* — from its
  scheduling to the next step's, minus the time the loop waited idle in between —
  so whatever the serving path adds to a step (observers, hand-off to the event loop,
  GIL waits, commands) is in the model, and a simulation with it predicts served runs.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Sequence

import numpy as np

from engine.core.cost_model import FEATURES, CostModel, step_features

#: Every HOLDOUT_EVERY-th step of a run is held out of the fit and scores it.
HOLDOUT_EVERY = 5
#: Step records are fitted with weights seconds**-0.5 (see ``fit``).
STEP_FIT_POWER = 0.5


class CalibrationError(ValueError):
    """The measurements cannot determine a cost model; the message says why."""


def fit(features: np.ndarray, seconds: np.ndarray, power: float = 1.0) -> np.ndarray:
    """Non-negative coefficients minimising squared error weighted by ``seconds**-power``.

    ``power=1``: *relative* error, every step alike — for profiling, where steps span
    three orders of magnitude and the target is a relative fidelity. ``power=0.5`` for
    a run's steps: a run is mostly small steps, and a relative fit lets its few long
    ones (a burst at --max-num-seqs) come out ~30% short — yet queueing is made of the
    long ones. Non-negative by a small active set: a feature whose coefficient comes
    out negative is dropped and the rest refitted.
    """
    weights = np.maximum(seconds, 1e-9) ** -power
    active = np.ones(features.shape[1], dtype=bool)
    # Drop features that never vary in the data (no information to fit them).
    active &= features.any(axis=0)
    while True:
        a = features[:, active] * weights[:, None]
        b = seconds * weights
        coef_active, *_ = np.linalg.lstsq(a, b, rcond=None)
        coef = np.zeros(features.shape[1])
        coef[active] = coef_active
        negative = coef < 0
        if not negative.any():
            return coef
        active &= ~negative


def step_cycles(frame) -> tuple[np.ndarray, np.ndarray]:
    """(features, cycle seconds) of every step of one run that another step follows.

    ``frame`` has the steps.parquet columns (docs/records.md), one row per step that
    ran, in step order.
    """
    frame = frame.sort("step")
    start = frame["schedule_start"].to_numpy()
    idle = frame["idle_before_s"].to_numpy()
    cycles = start[1:] - start[:-1] - idle[1:]
    rows = frame.head(frame.height - 1).iter_rows(named=True) if frame.height else iter(())
    x = [
        step_features(
            r["num_prefill_tokens"],
            r["num_decode_seqs"],
            r["num_decode_context_tokens"],
            r["prefill_attention_work"],
            r["num_blocks_swapped_out"] + r["num_blocks_swapped_in"],
            r["num_seqs"] - r["num_decode_seqs"],
            r.get("prefill_padded_attention_work") or 0,  # absent from older records
        )
        for r in rows
    ]
    return np.array(x, dtype=np.float64).reshape(-1, len(FEATURES)), cycles


def client_latency_from_requests(
    frames, max_send_lag_s: float | None = None
) -> tuple[float, int] | None:
    """(median seconds a request and its first token spend outside the engine, rows):
    ``ttft_from_sent_s - engine_ttft_s`` over the finished requests of run records that
    carry both the client's and the engine's columns (a ``schedscope run`` cell's
    requests.parquet) — the client's send to the engine's arrival stamp, plus the
    engine's first token to the client's. None when no row has both.

    ``max_send_lag_s``: leave out the requests the load generator sent later than this
    after their scheduled instant, or held for its in-flight cap (``send_lag_s``,
    ``in_flight_capped``): at those moments the generator was busy, and its own delay in
    reading the first token is the generator's, not the path to the engine (a lagging
    generator on a slow machine made a fit's client latency 10x the measured one)."""
    parts: list[np.ndarray] = []
    for frame in frames:
        if not {"ttft_from_sent_s", "engine_ttft_s", "status"} <= set(frame.columns):
            continue
        rows = frame.filter(frame["status"] == "ok")
        if max_send_lag_s is not None and "send_lag_s" in rows.columns:
            rows = rows.filter(rows["send_lag_s"].fill_null(0.0) <= max_send_lag_s)
        if max_send_lag_s is not None and "in_flight_capped" in rows.columns:
            rows = rows.filter(~rows["in_flight_capped"].fill_null(False))
        gap = (rows["ttft_from_sent_s"] - rows["engine_ttft_s"]).drop_nulls().to_numpy()
        parts.append(gap[np.isfinite(gap)])
    gaps = np.concatenate(parts) if parts else np.array([])
    if gaps.size == 0:
        return None
    return max(0.0, float(np.median(gaps))), int(gaps.size)


#: The steps.parquet columns a fit reads.
FIT_COLUMNS = frozenset(
    {
        "step",
        "schedule_start",
        "idle_before_s",
        "num_seqs",
        "num_prefill_tokens",
        "num_decode_seqs",
        "num_decode_context_tokens",
        "prefill_attention_work",
        "num_blocks_swapped_out",
        "num_blocks_swapped_in",
    }
)


#: Stretches of a run's clock, each (start, end) in seconds, ends included.
Stretches = Sequence[tuple[float, float]]


def started_inside(starts: np.ndarray, stretches: Stretches) -> np.ndarray:
    """Whether each instant of ``starts`` lies in one of ``stretches`` (on the same
    clock; they may overlap and come in any order)."""
    inside = np.zeros(len(starts), dtype=bool)
    for begin, end in stretches:
        inside |= (starts >= begin) & (starts <= end)
    return inside


def cycles_outside(frame, skip: Stretches = ()) -> tuple[np.ndarray, np.ndarray, int]:
    """(features, cycle seconds, how many were left out) of one run's usable cycles
    (:func:`usable_cycles`) but those of the steps that started inside a stretch of
    ``skip`` (``schedule_start``'s clock): the caller knows times when a step's cycle
    measured something besides the engine (the harness's: a load generator that fell
    behind on shared cores), and says how many it left out."""
    missing = sorted(FIT_COLUMNS - set(frame.columns))
    if missing:
        raise CalibrationError(f"step records lack the columns {missing} (docs/records.md)")
    x, y = step_cycles(frame)
    keep = y > 0
    if skip and len(y):
        # the cycle of each step another follows: every step but the last, in step order
        starts = frame.sort("step")["schedule_start"].to_numpy()[:-1]
        inside = keep & started_inside(starts, skip)
        return x[keep & ~inside], y[keep & ~inside], int(inside.sum())
    return x[keep], y[keep], 0


def usable_cycles(frame, skip: Stretches = ()) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_cycles` of one run's steps, those of a positive cycle only (a clock
    step backwards or a zero gap says nothing) and, with ``skip``, not started inside
    one of its stretches (:func:`cycles_outside`); CalibrationError when the records
    lack a column the fit needs."""
    x, y, _ = cycles_outside(frame, skip)
    return x, y


def fit_from_steps(
    frames, model: str = "", source: str = "", client_latency_s: float = 0.0
) -> CostModel:
    """A cost model fitted to the step cycles of one or more runs' step records;
    ``client_latency_s`` (from :func:`client_latency_from_requests`, when the runs have
    client records) is carried into the model as measured."""
    if not isinstance(frames, list | tuple):
        frames = [frames]
    pairs = [usable_cycles(frame) for frame in frames]
    return fit_cycles(
        np.concatenate([x for x, _ in pairs]),
        np.concatenate([y for _, y in pairs]),
        model=model,
        source=source,
        client_latency_s=client_latency_s,
    )


def fit_cycles(
    x: np.ndarray,
    y: np.ndarray,
    model: str = "",
    source: str = "",
    client_latency_s: float = 0.0,
    held: np.ndarray | None = None,
    power: float = STEP_FIT_POWER,
) -> CostModel:
    """A cost model fitted to step cycles already turned into features (``x``, one row
    per step, FEATURES order) and seconds (``y``, all > 0): the rows of ``held`` (a mask;
    default every HOLDOUT_EVERY-th row) held out and scoring the fit, the rest fitted
    (what :func:`fit_from_steps` does with a run's steps; ``harness.costmodel.evidence``
    pools several runs' rows). ``power``: the weights' (``fit``)."""
    if len(y) < 2 * len(FEATURES):
        raise CalibrationError(
            f"{len(y)} step cycles are too few to fit {len(FEATURES)} "
            "parameters; record a longer run"
        )
    if held is None:
        held = np.zeros(len(y), dtype=bool)
        held[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY] = True
    elif held.shape != y.shape or not held.any() or held.all():
        raise CalibrationError("the held-out steps must be some, not all, of the steps")
    coef = fit(x[~held], y[~held], power=power)
    fitted = CostModel.from_coefficients(
        (float(c) for c in coef),
        device="fitted from step records",
        model=model,
        source="steps",
        client_latency_s=client_latency_s,  # not in step records: from the client's
        fitted_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    predicted = x @ np.array(fitted.coefficients)
    errors = np.abs(predicted - y) / y
    stats = {
        "train_points": int((~held).sum()),
        "holdout_points": int(held.sum()),
        "holdout_median_rel_error": float(np.median(errors[held])),
        "holdout_p90_rel_error": float(np.quantile(errors[held], 0.9)),
        "train_median_rel_error": float(statistics.median(errors[~held])),
        "mean_cycle_s": float(y.mean()),
        # queueing is made of total time: how much of it the model accounts for
        "holdout_total_time_ratio": float(predicted[held].sum() / y[held].sum()),
        "runs": source,
    }
    return CostModel(**{**fitted.to_dict(), "fit": stats})
