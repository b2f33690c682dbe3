"""The step cycles behind a stored fit, so that each served run refines this machine's
cost model instead of replacing it.

A served ``schedscope run`` cell fits its own steps into the store (docs/run.md, "The
simulator check"). Fitted alone, one cell's steps describe one regime: a cell of a tune
confirm at 1.5x a profile's capacity (big batches, long queues) priced a decoding
sequence at 264 µs where this machine's quick calibration, and a 1x run, say 93-128 µs;
stored as the machine's model it made ``simulate`` of the default profile at 1x 100-180%
pessimistic, where the built-in model was within 11% (measured 2026-12-02, docs/
simulator.md "One run's fit is not the machine's"). So the store keeps, beside each
fit, the step cycles it was fitted from — per *source* (a calibration or a run's cell),
each thinned to at most :data:`MAX_STEPS_PER_SOURCE` rows — and a cell's refit is the
fit of the pool: the last calibration's rows (kept until the next calibration) and the
newest :data:`MAX_RUN_SOURCES` cells'. No source counts more than MAX_STEPS_PER_SOURCE
steps, however long its run, so no single run outweighs the rest.

A source whose steps ran far from the pool's speed is kept out of the refit unless
asked (:meth:`Evidence.refit`, :func:`off_speed`): a run beside a noisy neighbour, its
steps say half as long again as the others' for the same work, would pull every price
of the machine's model its way. It stays in the pool, and each refit judges it again.

The pool is a numpy ``.npz`` beside the model file (``cost-model-<key>.steps.npz``):
``features`` (rows x FEATURES), ``cycles`` (seconds), ``source`` (each row's index into
``sources``) and ``sources`` (JSON: name, kind, added_at, client_latency_s, steps,
swapped_blocks, generator_limited_steps_left_out).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.core.cost_model import FEATURES, CostModel

#: Rows kept per source (every k-th step, in order): enough for the fit's nine
#: parameters many times over, small enough that a pool stays under ~2 MB.
MAX_STEPS_PER_SOURCE = 4000
#: Run cells kept in a pool beside its calibration; the oldest goes first.
MAX_RUN_SOURCES = 8
CALIBRATION = "calibration"
RUN = "run"
#: The index of FEATURES' swap term: a pool with none of it keeps the prior price.
_SWAP = FEATURES.index("swap_block_s")
#: What a pool file says of each source (read by ``plus`` and ``refit``).
_SOURCE_KEYS = frozenset({"name", "kind", "client_latency_s", "steps"})
#: A source whose ``time_ratio`` is more than this factor above or below the median of
#: the sources' ratios is off the pool's speed (:func:`off_speed`). On the 2-core AMD
#: EPYC VM whose speed wanders (docs/simulator.md, "Calibrating in the regime of a
#: run"), the served runs of each series of three, minutes apart, took 0.82-1.25x their
#: series' median ratio to a fit's price: a band of 1.25 keeps that ordinary wandering
#: in the pool (where the speed band shows it) and leaves out a run half as slow again
#: as the rest. Across that machine's series the ratios ran 0.83-1.27, so a pool of
#: them can lose its slowest run to the rule: where such series are the machine's
#: habit, ``schedscope run --keep-off-speed-sources`` keeps them.
OFF_SPEED_FACTOR = 1.25
#: The rule needs this many sources with a ratio: of two, either may be the one off
#: (their median is their mean); with three or more the median is a source's own ratio,
#: and one source far off cannot move it.
OFF_SPEED_MIN_SOURCES = 3


class EvidenceError(ValueError):
    """A pool file that cannot be read back; the message says why."""


@dataclass
class Evidence:
    """Step cycles by source (see the module's docstring)."""

    features: np.ndarray = field(default_factory=lambda: np.zeros((0, len(FEATURES))))
    cycles: np.ndarray = field(default_factory=lambda: np.zeros(0))
    source: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    sources: list[dict] = field(default_factory=list)

    @classmethod
    def of_source(
        cls,
        features: np.ndarray,
        cycles: np.ndarray,
        name: str,
        kind: str,
        client_latency_s: float,
        generator_limited_steps_left_out: int = 0,
    ) -> Evidence:
        """One source's cycles (``features``/``cycles`` as ``engine.sim.cost_fit``'s
        ``usable_cycles`` gives them), thinned to MAX_STEPS_PER_SOURCE rows;
        ``generator_limited_steps_left_out``: how many of its run's cycles were not
        given, for starting while the load generator lagged (recorded as said)."""
        stride = max(1, -(-len(cycles) // MAX_STEPS_PER_SOURCE))
        features, cycles = features[::stride], cycles[::stride]
        return cls(
            np.asarray(features, dtype=np.float64).reshape(-1, len(FEATURES)),
            np.asarray(cycles, dtype=np.float64),
            np.zeros(len(cycles), dtype=np.int32),
            [
                {
                    "name": name,
                    "kind": kind,
                    "added_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "client_latency_s": float(client_latency_s),
                    "steps": len(cycles),
                    "swapped_blocks": float(features[:, _SWAP].sum()) if len(cycles) else 0.0,
                    "generator_limited_steps_left_out": int(generator_limited_steps_left_out),
                }
            ],
        )

    def __len__(self) -> int:
        return len(self.cycles)

    def plus(self, other: Evidence) -> Evidence:
        """This pool with ``other``'s sources added; a calibration among them replaces
        every source before it, and only the newest MAX_RUN_SOURCES runs stay."""
        pool = Evidence(
            np.concatenate([self.features, other.features]),
            np.concatenate([self.cycles, other.cycles]),
            np.concatenate([self.source, other.source + len(self.sources)]).astype(np.int32),
            [*self.sources, *other.sources],
        )
        kinds = [s["kind"] for s in pool.sources]
        last_calibration = max((i for i, k in enumerate(kinds) if k == CALIBRATION), default=-1)
        runs = [i for i, k in enumerate(kinds) if k == RUN and i > last_calibration]
        keep = sorted(
            ([last_calibration] if last_calibration >= 0 else []) + runs[-MAX_RUN_SOURCES:]
        )
        return pool.only(keep)

    def only(self, keep: list[int]) -> Evidence:
        """The pool of sources ``keep`` (indices into ``sources``), renumbered."""
        renumber = np.full(len(self.sources), -1, dtype=np.int32)
        renumber[keep] = np.arange(len(keep), dtype=np.int32)
        rows = np.isin(self.source, keep)
        return Evidence(
            self.features[rows],
            self.cycles[rows],
            renumber[self.source[rows]],
            [self.sources[i] for i in keep],
        )

    def refit(
        self, model: str, prior: CostModel | None = None, keep_off_speed: bool = False
    ) -> CostModel:
        """The cost model fitted to the pool but its sources off the pool's speed, its
        ``fit`` naming the sources fitted (``sources``: each one's held-out error and
        ``time_ratio``) and those left out (``sources_left_out``: name, kind, steps, and
        its ``time_ratio`` and the sources' ``median_time_ratio`` against the fit of
        the whole pool, the fit the rule judged; :func:`off_speed`). With
        ``keep_off_speed`` every source is fitted, and those the rule would have left
        out are named as ``off_speed_sources_kept``.

        Each fit: ``engine.sim.cost_fit.fit_cycles`` (every 5th row held out).
        ``client_latency_s`` is the median of the sources'; with no swap in any source
        the swap price is ``prior``'s (else the built-in's): a pool that never swapped
        knows nothing of swapping, and 0 would tell ``--preemption-mode auto`` that
        swaps are free."""
        from engine.sim.cost_fit import CalibrationError

        whole = self._fit(model, prior)
        described = whole.fit["sources"]
        off, median = off_speed(described)
        named = [
            {
                **{k: described[i][k] for k in ("name", "kind", "steps", "time_ratio")},
                "median_time_ratio": median,
            }
            for i in off
        ]
        if keep_off_speed:
            return dataclasses.replace(whole, fit={**whole.fit, "off_speed_sources_kept": named})
        if not off:
            return dataclasses.replace(whole, fit={**whole.fit, "sources_left_out": []})
        try:
            kept = self.only([i for i in range(len(self.sources)) if i not in off])
            fitted = kept._fit(model, prior)
        except CalibrationError:
            # what is left cannot be fitted alone (a few steps beside a calibration of
            # none): the whole pool, as before the rule, rather than no model
            return dataclasses.replace(whole, fit={**whole.fit, "sources_left_out": []})
        return dataclasses.replace(fitted, fit={**fitted.fit, "sources_left_out": named})

    def _fit(self, model: str, prior: CostModel | None) -> CostModel:
        """The cost model fitted to every source of the pool (:meth:`refit`'s terms)."""
        from engine.sim.cost_fit import HOLDOUT_EVERY, fit_cycles

        latency = statistics.median(s["client_latency_s"] for s in self.sources)
        fitted = fit_cycles(
            self.features,
            self.cycles,
            model=model,
            source=", ".join(s["name"] for s in self.sources),
            client_latency_s=latency,
        )
        if not self.features[:, _SWAP].any():
            swap = (prior or CostModel()).swap_block_s
            fitted = dataclasses.replace(fitted, swap_block_s=swap)
        predicted = self.features @ np.array(fitted.coefficients)
        errors = np.abs(predicted - self.cycles) / self.cycles
        held = np.zeros(len(self), dtype=bool)
        held[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY] = True
        described = []
        for i, source in enumerate(self.sources):
            mine = held & (self.source == i)
            rows = self.source == i
            priced = float(predicted[rows].sum())
            described.append(
                {
                    **source,
                    "holdout_median_rel_error": (
                        float(np.median(errors[mine])) if mine.any() else None
                    ),
                    # what the source's steps took against the pooled fit's price for
                    # them: how fast the machine ran then (speed_range below)
                    "time_ratio": float(self.cycles[rows].sum() / priced) if priced > 0 else None,
                }
            )
        return dataclasses.replace(fitted, fit={**fitted.fit, "sources": described})

    # -- files ------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as file:  # np.savez would append ".npz" to a bare name
            np.savez_compressed(
                file,
                features=self.features,
                cycles=self.cycles,
                source=self.source,
                sources=np.array(json.dumps(self.sources)),
            )

    @classmethod
    def load(cls, path: Path) -> Evidence:
        try:
            with np.load(path, allow_pickle=False) as data:
                evidence = cls(
                    np.asarray(data["features"], dtype=np.float64),
                    np.asarray(data["cycles"], dtype=np.float64),
                    np.asarray(data["source"], dtype=np.int32),
                    json.loads(str(data["sources"])),
                )
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise EvidenceError(f"{path}: not a pool of step cycles ({exc})") from None
        rows = len(evidence.cycles)
        shape_ok = evidence.features.shape == (rows, len(FEATURES))
        if not shape_ok or len(evidence.source) != rows:
            raise EvidenceError(
                f"{path}: expected {len(FEATURES)} features a row (another schedscope "
                f"version's pool?), got an array of shape {evidence.features.shape}"
            )
        if not isinstance(evidence.sources, list) or not all(
            isinstance(source, dict) and _SOURCE_KEYS <= source.keys()
            for source in evidence.sources
        ):
            raise EvidenceError(f"{path}: its sources must be objects with {sorted(_SOURCE_KEYS)}")
        named = len(evidence.sources)
        if rows and not (0 <= evidence.source.min() and evidence.source.max() < named):
            raise EvidenceError(f"{path}: rows name sources it does not list")
        return evidence


def from_steps_paths(paths: list[Path], name: str, kind: str, client_latency_s: float) -> Evidence:
    """The cycles of the steps.parquet files (or directories holding one) at ``paths``
    as one source, but those of the steps that started while the load generator lagged
    its schedule, as the client records beside them say (a run cell's requests.parquet,
    a served calibration's client.parquet:
    :func:`harness.records.generator_limited.stretches_beside`); the source records how
    many were left out. Raises ``engine.sim.cost_fit.CalibrationError`` for records a
    fit cannot read."""
    import polars as pl

    from engine.sim.cost_fit import cycles_outside
    from harness.records.generator_limited import stretches_beside

    triples = []
    for path in paths:
        file = path / "steps.parquet" if path.is_dir() else path
        triples.append(cycles_outside(pl.read_parquet(file), stretches_beside(file).stretches))
    return Evidence.of_source(
        np.concatenate([x for x, _, _ in triples]),
        np.concatenate([y for _, y, _ in triples]),
        name,
        kind,
        client_latency_s,
        generator_limited_steps_left_out=sum(n for _, _, n in triples),
    )


def of_calibration(fitted: CostModel, from_steps: list[Path] | None = None) -> Evidence | None:
    """The pool a calibration starts: the steps it was fitted from (a served
    calibration's records, or ``calibrate --from-steps`` paths) as its one source;
    None for a fit with no step records (the profiling sweep times the runner alone, not
    step cycles), which starts no pool."""
    records = (fitted.fit.get("served") or {}).get("records")
    paths = from_steps or ([Path(records)] if records else None)
    if not paths:
        return None
    name = ", ".join(map(str, paths))
    return from_steps_paths(paths, name, CALIBRATION, fitted.client_latency_s)


def off_speed(sources: list[dict]) -> tuple[list[int], float | None]:
    """(the indices of ``sources`` off the pool's speed, the median of their ratios):
    with at least OFF_SPEED_MIN_SOURCES sources that have a ``time_ratio`` (as
    :meth:`Evidence.refit` describes them, against the fit of the whole pool), those
    whose ratio is more than OFF_SPEED_FACTOR times above or below the median of the
    ratios. Never the calibration (a pool has one at most): its schedule is the one
    source made to cover every shape of step, where a run covers its profile's regime
    only, and without it a pool of runs' steps would price the shapes none of them ran
    by extrapolation (docs/simulator.md, "One run's fit is not the machine's"); when it
    is the one off, the machine has changed since, and a new calibration is the cure.
    Its ratio still counts towards the median. ([], None) with too few sources."""
    ratios = {
        i: float(s["time_ratio"])
        for i, s in enumerate(sources)
        if isinstance(s.get("time_ratio"), int | float)
        and math.isfinite(s["time_ratio"])
        and s["time_ratio"] > 0
    }
    if len(ratios) < OFF_SPEED_MIN_SOURCES:
        return [], None
    median = statistics.median(ratios.values())
    off = [
        i
        for i, ratio in ratios.items()
        if sources[i].get("kind") != CALIBRATION
        and not 1 / OFF_SPEED_FACTOR <= ratio / median <= OFF_SPEED_FACTOR
    ]
    return off, median


def left_out_text(left_out: list[dict]) -> str:
    """The sources a refit left out for their speed, in a few words each: "run CELL
    (its steps took 1.52x the price, the sources' median 0.98x)"."""
    return "; ".join(
        f"{s.get('kind', '?')} {s.get('name', '?')} (its steps took {s['time_ratio']:.2f}x "
        f"the price, the sources' median {s['median_time_ratio']:.2f}x)"
        for s in left_out
    )


def speed_range(fit: dict) -> tuple[float, float, int] | None:
    """(fastest, slowest ``time_ratio``, sources) of a pooled fit's sources (the smallest
    and the largest ratio): the range
    of speeds this machine ran its steps at across the calibration and runs the fit
    came from, against the fit's price. None with fewer than two sources that say it
    (one source has no range to show)."""
    # A ratio that is not a speed (0, negative, NaN: a hand-edited file) is left out,
    # not scaled by (CostModel.at_speed refuses it).
    ratios = [
        s["time_ratio"]
        for s in fit.get("sources") or []
        if isinstance(s, dict)
        and isinstance(s.get("time_ratio"), int | float)
        and math.isfinite(s["time_ratio"])
        and s["time_ratio"] > 0
    ]
    if len(ratios) < 2:
        return None
    return min(ratios), max(ratios), len(ratios)
