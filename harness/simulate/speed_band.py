"""The speed band of a simulation: the same schedule simulated again at the slowest and
the fastest speed this machine was seen to run its steps at (docs/simulator.md, "The
speed band").

A pooled fit (:mod:`harness.costmodel.evidence`) knows, for each of its sources (the
calibration, the newest served runs), what that source's steps took against the fit's
price: its ``time_ratio``. On a quiet machine they all sit near 1. On a machine whose
speed wanders (a VM beside busy neighbours: 0.88x to 1.27x the price within half an
hour was seen), near the machine's capacity that moves served latencies by two to three
times as much, far more than the fit's own error. The band shows it: every step cost of
the model scaled by the slowest and by the fastest ratio
(:meth:`engine.core.cost_model.CostModel.at_speed`), the same schedule simulated with
each, and TTFT and E2E p50/p95 per policy and class reported as a range beside the
model's own figure.

This module holds the parts that need no simulator: which speeds, the figures kept of a
policy's summary, the table. :func:`harness.simulate.driver.run_simulations` runs the two
extra simulations and puts the result in summary.json under :data:`SUMMARY_KEY`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.table import Table

from engine.core.cost_model import CostModel
from harness.costmodel.evidence import speed_range

#: summary.json's key for the band.
SUMMARY_KEY = "speed_band"
#: The two ends of the band, in the order they are shown.
ENDS = ("fastest", "slowest")
#: The figures the simulator is judged by, per class: here, and in the report's check of
#: a served run against its simulation (harness/report/simulator_check.py), which must
#: compare the same ones the band carries.
METRICS = ("ttft_s", "e2e_s")
STATS = ("p50", "p95")


@dataclass(frozen=True)
class Speeds:
    """The ends of the speed range a fit's sources ran at, as step-time ratios against
    the fit's price (below 1: faster than the price)."""

    fastest: float
    slowest: float
    sources: int

    def ratio(self, end: str) -> float:
        """The ratio at ``end``, one of :data:`ENDS`."""
        if end not in ENDS:
            raise ValueError(f"unknown end of the speed band {end!r}; expected one of {ENDS}")
        return self.fastest if end == "fastest" else self.slowest


def observed_speeds(model: CostModel) -> Speeds | None:
    """The speeds ``model``'s sources ran at; None when fewer than two sources say
    (the built-in model, a file fitted once, a fresh calibration: nothing to span)."""
    found = speed_range(model.fit)
    if found is None:
        return None
    fastest, slowest, sources = found
    return Speeds(fastest, slowest, sources)


def figures(policy: dict) -> dict[str, dict[str, dict[str, float | None]]]:
    """Group (``all`` and each class) -> metric -> stat -> value, of one policy of a
    summary (:func:`harness.records.summary.policy_summary`)."""
    groups = {"all": policy["overall"], **policy["classes"]}
    return {
        group: {m: {s: g["metrics"].get(m, {}).get(s) for s in STATS} for m in METRICS}
        for group, g in groups.items()
    }


def band(model: CostModel, simulate_at: Callable[[CostModel], dict[str, dict]]) -> dict | None:
    """summary.json's :data:`SUMMARY_KEY`: ``simulate_at(model)`` (policy -> its
    summary) called with ``model`` at each end of its observed speeds. ``time_ratios``
    and ``sources`` say where the ends came from; ``policies`` holds, per policy, group
    and metric, each stat's ``{"fastest": value, "slowest": value}``. None when the
    model has no observed range."""
    speeds = observed_speeds(model)
    if speeds is None:
        return None
    at_end = {end: simulate_at(model.at_speed(speeds.ratio(end))) for end in ENDS}
    policies: dict[str, dict] = {}
    for end, summaries in at_end.items():
        for name, summary in summaries.items():
            for group, metrics in figures(summary).items():
                for metric, stats in metrics.items():
                    for stat, value in stats.items():
                        policies.setdefault(name, {}).setdefault(group, {}).setdefault(
                            metric, {}
                        ).setdefault(stat, {})[end] = value
    return {
        "time_ratios": {end: speeds.ratio(end) for end in ENDS},
        "sources": speeds.sources,
        "policies": policies,
    }


def policy_part(band: object, policy: str | None = None) -> dict | None:
    """``{time_ratios, sources, groups}`` of ``policy`` in a summary's band (``groups``:
    class or ``all`` -> metric -> stat -> ``{fastest, slowest}``); with ``policy`` None,
    the band's only policy (a served cell's counterpart simulates one). None when the
    band (as read from a file) has no such part."""
    if not isinstance(band, dict):
        return None
    policies = band.get("policies")
    if not isinstance(policies, dict):
        return None
    if policy is None:
        groups = next(iter(policies.values())) if len(policies) == 1 else None
    else:
        groups = policies.get(policy)
    if not isinstance(groups, dict):
        return None
    return {
        "time_ratios": band.get("time_ratios"),
        "sources": band.get("sources"),
        "groups": groups,
    }


def _cell(value: float | None, ends: dict[str, float | None]) -> str:
    low, high = ends.get("fastest"), ends.get("slowest")
    main = "-" if value is None else f"{value:.3f}"
    if low is None or high is None:
        return main
    return f"{main} ({low:.3f}-{high:.3f})"


def band_table(summary: dict) -> Table | None:
    """The band of a simulate summary: per policy and group, each figure at the model's
    own price with its range at the fastest and slowest speed; None without a band."""
    entry = summary.get(SUMMARY_KEY)
    if not entry:
        return None
    ratios = entry["time_ratios"]
    table = Table(
        title=(
            f"speed band: the same schedule with step costs at {ratios['fastest']:.2f}x and "
            f"{ratios['slowest']:.2f}x the model's price, the fastest and slowest this "
            f"machine ran across the fit's {entry['sources']} sources"
        )
    )
    columns = [f"{m.removesuffix('_s')} {s}" for m in METRICS for s in STATS]
    for column in ("policy", "class", *columns):
        table.add_column(column, justify="left" if column in ("policy", "class") else "right")
    for name, groups in entry["policies"].items():
        own = figures(summary["policies"][name])
        for group, metrics in groups.items():
            table.add_row(
                name if group == "all" else "",
                group,
                *(
                    _cell(own.get(group, {}).get(m, {}).get(s), metrics[m][s])
                    for m in METRICS
                    for s in STATS
                ),
            )
        table.add_section()
    return table
