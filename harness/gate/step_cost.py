"""The gate's step-cost line: did the change make the engine's steps slower?

Per-request latency on a small shared machine moves with everything: the machine's
speed (0.82-1.27x between 5-s windows on a 2-core VM), the load generator beside the
engine, and queueing, which amplifies every wobble near saturation. A served run's
*steps* are steadier evidence: thousands of them, each timed, each with the batch it ran
(prefill tokens, decode sequences, context tokens...). So the gate also compares what a
step costs, priced over the same batches on both sides:

1. every step cycle of both sides (``engine.sim.cost_fit.step_cycles``: a step's full
   cycle, as the simulator's cost model predicts it) is priced by one *reference* cost
   model fitted to both sides' cycles together, so that a batch of a given shape has one
   price whichever side ran it, and a change of batch mix (a scheduling change) does not
   pass for a change of step cost;
2. each side's *step-cost ratio* is its cycles' total time over their total price; the
   change is ``current ratio / baseline ratio - 1`` (positive: steps got slower);
3. its interval is a bootstrap over the same stretches of the schedule on both sides
   (each run's steps cut into ``num_blocks`` windows of time since its first step, the
   same window indices drawn for both sides) and, with several runs a side, over the
   runs — drawn *paired* (the same run index on both sides) when both sides have as many
   runs, so that base and head runs made side by side (interleaved: base, head, base,
   head) share the machine's drift and it cancels in the ratio.

Beside the line, the gate asks the simulator what each side's steps do to latency:
the current cell's exact schedule (its requests.parquet) simulated with a cost model
fitted to each side's steps alone (:func:`simulated_latency`). That is deterministic
given the fits, so it tells a latency regression that the step costs explain from one
they do not (a scheduling change): docs/gate.md, "Step cost".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np

from engine.config import EngineConfig
from harness.gate.sides import GateInputError

#: The rule metric of this line.
STEP_COST = "step_cost"
#: Fewer step cycles than this on a side are too few to price (the reference fit has
#: nine parameters; a run of a few seconds has thousands of steps).
MIN_CYCLES = 200


@dataclass
class StepRuns:
    """One side's step cycles of one cell, run by run."""

    features: list[np.ndarray] = field(default_factory=list)
    cycles: list[np.ndarray] = field(default_factory=list)
    #: each cycle's start, seconds since the run's first step
    starts: list[np.ndarray] = field(default_factory=list)
    #: each cycle's start on the steps' own clock (a run cell's: Unix seconds)
    clock: list[np.ndarray] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)

    @property
    def num_cycles(self) -> int:
        return sum(len(c) for c in self.cycles)

    def all_features(self) -> np.ndarray:
        return np.concatenate(self.features)

    def all_cycles(self) -> np.ndarray:
        return np.concatenate(self.cycles)


def read_step_runs(paths: tuple[Path, ...] | list[Path]) -> StepRuns:
    """The usable step cycles of each steps.parquet in ``paths`` (a run's served cell
    each). Raises :class:`GateInputError` naming the file for one that does not read or
    lacks a column a fit needs."""
    import polars as pl

    from engine.sim.cost_fit import FIT_COLUMNS, CalibrationError, step_cycles

    runs = StepRuns()
    for path in paths:
        try:
            frame = pl.read_parquet(path)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise GateInputError(f"{path}: unreadable step records ({exc})") from None
        missing = sorted(FIT_COLUMNS - set(frame.columns))
        if missing:
            raise GateInputError(f"{path}: step records lack the columns {missing}")
        frame = frame.sort("step")
        try:
            x, y = step_cycles(frame)
        except CalibrationError as exc:
            raise GateInputError(f"{path}: {exc}") from None
        start = frame["schedule_start"].to_numpy()[:-1] if frame.height else np.zeros(0)
        keep = np.isfinite(y) & (y > 0)
        runs.features.append(x[keep])
        runs.cycles.append(y[keep])
        runs.starts.append(start[keep] - (start[keep].min() if keep.any() else 0.0))
        runs.clock.append(start[keep])
        runs.paths.append(path)
    return runs


@dataclass(frozen=True)
class StepCostChange:
    """The step-cost comparison of one cell."""

    #: each side's total cycle time over its total reference price
    baseline_ratio: float
    current_ratio: float
    #: current_ratio / baseline_ratio - 1 (positive: the current steps are slower)
    change: float
    interval: tuple[float, float]
    baseline_cycles: int
    current_cycles: int
    #: "paired" (run i of each side drawn together), "independent" or "one run a side"
    runs_drawn: str


def step_cost_change(
    baseline: StepRuns,
    current: StepRuns,
    *,
    confidence: float,
    resamples: int,
    num_blocks: int,
    seed: int,
) -> StepCostChange:
    """The step-cost change of ``current`` against ``baseline`` and its bootstrap
    interval (the module's method). Raises :class:`GateInputError` when a side has fewer
    than :data:`MIN_CYCLES` usable step cycles."""
    from engine.sim.cost_fit import fit_cycles

    for side, name in ((baseline, "baseline"), (current, "current")):
        if side.num_cycles < MIN_CYCLES:
            where = ", ".join(map(str, side.paths)) or "no step records"
            raise GateInputError(
                f"step cost: the {name} has {side.num_cycles} usable step cycles ({where}); "
                f"at least {MIN_CYCLES} are needed to price them"
            )
    reference = fit_cycles(
        np.concatenate([baseline.all_features(), current.all_features()]),
        np.concatenate([baseline.all_cycles(), current.all_cycles()]),
        source="the gate's reference price (both sides' steps)",
    )
    coefficients = np.array(reference.coefficients)
    together = side_by_side(baseline, current)
    if together:
        # run i of both sides ran at the same time: the same windows of the wall clock,
        # so a slow second of the machine lands in the same window on both sides
        grids = [_overlap(b, c) for b, c in zip(baseline.clock, current.clock, strict=True)]
        a_base, p_base = _block_sums(baseline.clock, baseline, coefficients, grids, num_blocks)
        a_cur, p_cur = _block_sums(current.clock, current, coefficients, grids, num_blocks)
    else:
        span = max(float(s.max()) for side in (baseline, current) for s in side.starts if s.size)
        span = span if span > 0 else 1.0
        a_base, p_base = _block_sums(
            baseline.starts, baseline, coefficients, [(0.0, span)] * len(baseline.starts),
            num_blocks,
        )  # fmt: skip
        a_cur, p_cur = _block_sums(
            current.starts, current, coefficients, [(0.0, span)] * len(current.starts),
            num_blocks,
        )  # fmt: skip
    base_ratio = float(a_base.sum() / p_base.sum())
    cur_ratio = float(a_cur.sum() / p_cur.sum())
    rng = np.random.default_rng(seed)
    runs_b, runs_c = a_base.shape[0], a_cur.shape[0]
    paired = runs_b == runs_c and runs_b > 1
    changes = np.empty(resamples)
    for i in range(resamples):
        blocks = rng.integers(0, num_blocks, num_blocks)
        rb: np.ndarray = _draw(rng, runs_b)
        rc: np.ndarray = rb if paired else _draw(rng, runs_c)
        priced_b = p_base[np.ix_(rb, blocks)].sum()
        priced_c = p_cur[np.ix_(rc, blocks)].sum()
        if priced_b <= 0 or priced_c <= 0:
            changes[i] = np.nan
            continue
        ratio_b = a_base[np.ix_(rb, blocks)].sum() / priced_b
        ratio_c = a_cur[np.ix_(rc, blocks)].sum() / priced_c
        changes[i] = ratio_c / ratio_b - 1
    changes = changes[np.isfinite(changes)]
    alpha = 1 - confidence
    low, high = np.quantile(changes, [alpha / 2, 1 - alpha / 2])
    return StepCostChange(
        baseline_ratio=base_ratio,
        current_ratio=cur_ratio,
        change=cur_ratio / base_ratio - 1,
        interval=(float(low), float(high)),
        baseline_cycles=baseline.num_cycles,
        current_cycles=current.num_cycles,
        runs_drawn=("side by side, " if together else "")
        + (
            "paired" if paired else ("independent" if max(runs_b, runs_c) > 1 else "one run a side")
        ),
    )


def _draw(rng: np.random.Generator, runs: int) -> np.ndarray:
    """Run indices drawn with replacement; the one run of a side with one."""
    return rng.integers(0, runs, runs) if runs > 1 else np.zeros(1, dtype=int)


#: Runs whose steps share at least this share of their spans ran side by side.
SIDE_BY_SIDE_OVERLAP = 0.5


def side_by_side(baseline: StepRuns, current: StepRuns) -> bool:
    """Whether run i of the baseline and run i of the current ran at the same time, for
    every i (as many runs a side, each pair's steps overlapping in time for at least
    :data:`SIDE_BY_SIDE_OVERLAP` of the shorter one's span): two servers on the same
    machine at once, each loaded by its own generator."""
    if len(baseline.clock) != len(current.clock):
        return False
    for b, c in zip(baseline.clock, current.clock, strict=True):
        if not (b.size and c.size):
            return False
        low, high = _overlap(b, c)
        shorter = min(float(b.max() - b.min()), float(c.max() - c.min()))
        if shorter <= 0 or (high - low) < SIDE_BY_SIDE_OVERLAP * shorter:
            return False
    return True


def _overlap(b: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """The stretch of time both runs' steps cover."""
    return max(float(b.min()), float(c.min())), min(float(b.max()), float(c.max()))


def _block_sums(
    times: list[np.ndarray],
    side: StepRuns,
    coefficients: np.ndarray,
    grids: list[tuple[float, float]],
    num_blocks: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(actual seconds, priced seconds) per run x window: run r's ``times`` cut into
    ``num_blocks`` equal windows of ``grids[r]`` (start, end); steps outside it are left
    out, a window with no step holds 0 in both."""
    actual = np.zeros((len(side.cycles), num_blocks))
    priced = np.zeros((len(side.cycles), num_blocks))
    for r, (x, y, t) in enumerate(zip(side.features, side.cycles, times, strict=True)):
        start, end = grids[r]
        width = (end - start) or 1.0
        inside = (t >= start) & (t <= end)
        index = np.minimum(((t[inside] - start) / width * num_blocks).astype(int), num_blocks - 1)
        np.add.at(actual[r], index, y[inside])
        np.add.at(priced[r], index, x[inside] @ coefficients)
    return actual, priced


def fit_side(side: StepRuns):
    """A cost model fitted to one side's step cycles alone (every 5th held out)."""
    from engine.sim.cost_fit import fit_cycles

    return fit_cycles(
        side.all_features(), side.all_cycles(), source=", ".join(map(str, side.paths))
    )


def simulated_latency(cell_dir: Path, cost_model) -> dict[str, dict[str, float | None]] | None:
    """The served cell at ``cell_dir``'s own schedule — each request of its
    requests.parquet at its schedule offset, with its class, priority, prompt and the
    output it produced — simulated with ``cost_model`` and the engine knobs its run.json
    records: ``{class or "all": {"ttft_p95": s, "e2e_p95": s}}``. None when the cell
    records no engine configuration or no request."""
    import json

    import polars as pl

    from harness.profiles import Profile
    from harness.profiles.schedule import RequestSpec
    from harness.simulate.driver import simulate

    try:
        info = json.loads((cell_dir / "run.json").read_text())
        rows = pl.read_parquet(cell_dir / "requests.parquet")
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None
    config = engine_config_of(info.get("config"))
    if config is None or not rows.height:
        return None
    if "schedule_offset_s" not in rows.columns:  # a simulated cell: its virtual time
        if "scheduled_at" not in rows.columns:
            return None
        rows = rows.with_columns(
            schedule_offset_s=pl.col("scheduled_at") - pl.col("scheduled_at").min()
        )
    rows = rows.sort("schedule_offset_s", "request_id")
    specs = [
        RequestSpec(
            request_id=str(r["request_id"]),
            index=i,
            phase=int(r.get("phase") or 0),
            class_name=str(r["class"]),
            prompt_tokens=int(r["prompt_tokens"]),
            # what the served engine produced (a cut request: what it was asked for)
            output_tokens=int(r["output_tokens"] or r["max_tokens"])
            if r["status"] == "ok"
            else int(r["max_tokens"]),
            max_tokens=int(r["max_tokens"]),
            priority=int(r.get("priority") or 0),
            scheduled_at=float(r["schedule_offset_s"]),
        )
        for i, r in enumerate(rows.iter_rows(named=True))
    ]
    # With explicit requests the simulator reads nothing of the profile but its name.
    named = cast(Profile, SimpleNamespace(name=str(info.get("profile") or "gate")))
    result = simulate(named, config, cost_model, requests=specs, record_decisions=False)
    frame = result.requests
    out: dict[str, dict[str, float | None]] = {}
    for klass in ["all", *sorted(frame["class"].unique().to_list())]:
        part = frame if klass == "all" else frame.filter(pl.col("class") == klass)
        part = part.filter(pl.col("status") == "ok")
        out[klass] = {
            "ttft_p95": _p95(part["ttft_s"].drop_nulls().to_numpy()),
            "e2e_p95": _p95(part["e2e_s"].drop_nulls().to_numpy()),
        }
    return out


def engine_config_of(data) -> EngineConfig | None:
    """The EngineConfig a run.json ``config`` (``dataclasses.asdict`` of one) describes;
    None when it is absent or does not build one."""
    from engine.config import CacheConfig, ConfigError, ExecutionConfig, SchedulerConfig

    if not isinstance(data, dict):
        return None
    try:
        return EngineConfig(
            scheduler=SchedulerConfig(**data["scheduler"]),
            cache=CacheConfig(**data["cache"]),
            model=data["model"],
            execution=ExecutionConfig(**data.get("execution", {})),
        )
    except (KeyError, TypeError, ValueError, ConfigError):
        return None


def _p95(values: np.ndarray) -> float | None:
    if not values.size:
        return None
    value = float(np.quantile(values, 0.95))
    return value if math.isfinite(value) else None
