"""A ``--target`` cell checks the simulator when a fit of that target is stored
(``schedscope calibrate --from-run``; docs/run.md, "The simulator check").

Before the cell's load, the target's identity is read as ``calibrate --from-run`` reads
it from a finished run (harness/costmodel/target_identity.py: ``/version``,
``/v1/models``, one scrape of ``/metrics``, ``--target-knobs``), and the store is asked
for its fit (:func:`find_check`). After the load, the cell's schedule is simulated with
that fit and the target's engine semantics into ``<cell>/simulated/``
(:func:`simulate_target`), which the report's "Simulator vs this run" section compares
per class, as for a served cell. The fit predates the run (it was looked up before the
load; run.json ``simulator_check.predates_run`` says whether it was made before the run
started), so the check is out of sample. Nothing here fails the cell.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.costmodel import store as cost_store
from harness.costmodel.target import TargetError
from harness.costmodel.target_identity import (
    TARGET_INFO_KEY,
    TARGET_KNOBS_KEY,
    TargetIdentity,
    identity,
    target_policy,
)
from harness.report.simulator_check import SIMULATED_DIR


@dataclass(frozen=True)
class TargetCheck:
    """The stored fit a --target cell's check simulates with, found before its load."""

    identity: TargetIdentity
    entry: cost_store.StoredModel | None
    started_at: datetime
    #: the target's scheduling policy (its --scheduling-policy knob; vLLM's default fcfs)
    policy: str = "fcfs"

    @property
    def predates_run(self) -> bool:
        model = self.entry.model if self.entry else None
        if model is None:
            return False
        try:
            fitted = datetime.fromisoformat(model.fitted_at)
        except ValueError:
            return False
        return (fitted if fitted.tzinfo else fitted.replace(tzinfo=UTC)) < self.started_at

    def record(self) -> dict:
        """The cell's run.json ``simulator_check``."""
        key = self.identity.fingerprint.key
        if self.entry is None or self.entry.model is None:
            return {
                "model": None,
                "fingerprint_key": key,
                "skipped": f"no stored fit of this target (target:{self.identity.fingerprint.name}"
                f", key {key}): `schedscope calibrate --from-run` on this run makes one",
            }
        return {
            "model": str(self.entry.path),
            "target": self.identity.fingerprint.name,
            "fitted_at": self.entry.model.fitted_at or None,
            "fingerprint_key": key,
            "run_started_at": self.started_at.isoformat(),
            "predates_run": self.predates_run,
            "holdout_median_rel_error": self.entry.model.fit.get("holdout_median_rel_error"),
        }


def find_check(
    url: str,
    before: dict,
    target_knobs: str | None,
    machine: dict | None,
    headers: dict | None = None,
) -> TargetCheck | str:
    """The stored fit of the target at ``url`` (``before``: what it said of itself,
    harness/run/target_info.py), or why its identity could not be read."""
    from harness.run.scrape import MetricsScraper, metrics_frame

    started = datetime.now(UTC)
    scraper = MetricsScraper(url, headers=headers)
    scraper.scrape_once()
    metrics = metrics_frame(scraper.rows) if scraper.rows else None
    info = {
        TARGET_INFO_KEY: {"before": before},
        TARGET_KNOBS_KEY: target_knobs,
        "machine": machine or {},
    }
    try:
        found = identity(info, metrics)
        policy = target_policy(info)
    except TargetError as exc:
        return str(exc)
    stored = [
        e
        for e in cost_store.target_entries()
        if e.target is not None and e.target.key == found.fingerprint.key
    ]
    return TargetCheck(found, stored[-1] if stored else None, started, policy)


def simulate_target(
    check: TargetCheck,
    cell_name: str,
    profile,
    seed: int | None,
    cell_dir: Path,
    show: Callable[[str], None],
) -> dict:
    """The cell's schedule simulated with the target's fit and engine knobs (its own
    scheduling policy when its knobs name one, else fcfs) into ``cell_dir/simulated/``;
    the run.json entry."""
    from engine.config import ConfigError
    from harness.serve.knobs import build_engine_config
    from harness.simulate.driver import run_simulations

    entry = check.record()
    if check.entry is None or check.entry.model is None:
        show(f"{cell_name}: no simulator check: {entry['skipped']}")
        return entry
    if not (cell_dir / "requests.parquet").is_file():
        return {**entry, "skipped": "the cell has no requests.parquet to compare with"}
    knobs = {**check.identity.simulate, "scheduling_policy": check.policy}
    try:
        config = build_engine_config(knobs)
    except ConfigError as exc:
        return {**entry, "skipped": f"the target's knobs make no engine config: {exc}"}
    show(f"{cell_name}: simulating the same schedule with target:{entry['target']}")
    run_simulations(
        profile,
        {cell_name: config},
        check.entry.model,
        cell_dir / SIMULATED_DIR,
        seed=seed,
        write_decisions=False,
    )
    return {**entry, "policy": check.policy, "records": f"{SIMULATED_DIR}/requests.parquet"}
