"""Assemble the report: read each run, compute every table, stall, finding and verdict.

``build_report(run_dirs, options) -> Report``; ``harness.report.render`` writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from engine.core.token_timing import STALL_FLOOR_S
from harness.report import (
    cache_ladder,
    diagnosis,
    errors,
    figures,
    prefix_cache,
    sessions,
    simulator_check,
    stalls,
    tables,
    verdict,
)
from harness.report.cells import baseline, cell_groups
from harness.report.inputs import BrokenCell, PolicyData, ReportInputError, RunData, open_runs

if TYPE_CHECKING:
    from harness.profiles import Profile


@dataclass
class ReportOptions:
    stall_threshold_s: float | None = None  # None: max(250 ms, 5x the run's median ITL)
    profile: str | None = None  # SLOs: profile name/file; default: the run's own
    resamples: int = 200
    seed: int = 20260101
    figures: bool = True


@dataclass
class PolicyReport:
    data: PolicyData
    frame: pl.DataFrame
    duration_s: float
    threshold_s: float
    threshold_note: str | None
    stalls: pl.DataFrame
    stall_sources: dict
    groups: dict
    starvation: dict | None
    facts: dict
    findings: list[dict] = field(default_factory=list)
    #: why requests failed (harness/report/errors.py)
    errors: dict = field(default_factory=dict)
    #: whether the trap rules were applied (False: see ``undiagnosed``, or they failed)
    diagnosed: bool = False
    #: why the trap rules cannot be applied (diagnosis.unknown_facts); None when they can
    undiagnosed: str | None = None
    #: summary.json's ``prefix_cache`` (harness/report/prefix_cache.py); None: nothing known
    prefix_cache: dict | None = None
    #: summary.json's ``sessions`` (harness/report/sessions.py); None: no session rows
    sessions: dict | None = None


@dataclass
class RunReport:
    run: RunData
    slos: dict
    slo_source: str
    policies: dict[str, PolicyReport]
    short_class: str | None
    long_class: str | None
    verdicts: dict
    against_fcfs: list[dict]
    #: served vs simulated per cell and class (harness/report/simulator_check.py); None
    #: when no cell has a simulated counterpart
    simulator_check: dict | None = None
    #: the rungs of a prefix-reuse ladder side by side (harness/report/cache_ladder.py);
    #: None when the run's profile has none
    cache_ladder: dict | None = None


@dataclass
class Report:
    runs: list[RunReport]
    options: ReportOptions
    figures: list[tuple[str, str, Any]] = field(
        default_factory=list
    )  # (section, title, plotly fig)
    missing: list[str] = field(default_factory=list)
    #: Cells left out because their records cannot be used (harness/report/validate.py).
    broken: list[BrokenCell] = field(default_factory=list)


def _profile_candidates(options: ReportOptions | None, run: RunData) -> list[tuple[str, str]]:
    """(profile name or file, where it was named) for ``run``, in the order the SLOs take
    them: ``--profile``, the run's summary.json, its run config, its rows."""
    candidates = []
    if options is not None and options.profile:
        candidates.append((options.profile, "--profile"))
    if isinstance(run.info.get("profile"), str):
        candidates.append((run.info["profile"], "summary.json profile"))
    rc = run.info.get("run_config") or {}
    if isinstance(rc, dict) and isinstance(rc.get("profile"), str):
        candidates.append((rc["profile"], f"{run.info.get('run_config_file')} profile"))
    for data in run.policies.values():
        if data.requests.collect_schema().get("profile") == pl.String:
            names = (
                data.requests.select(pl.col("profile").unique())
                .collect()["profile"]
                .drop_nulls()
                .to_list()
            )
            candidates += [(n, "requests.parquet profile") for n in names[:1]]
            break
    return candidates


def _resolve(candidates: list[tuple[str, str]]) -> tuple[Profile | None, str | None]:
    """The first candidate that resolves to a profile, and where it was named."""
    from harness.profiles import ProfileError, resolve_profile

    for name, source in candidates:
        try:
            return resolve_profile(name), source
        except (ProfileError, OSError):
            continue
    return None, None


def run_profile(options: ReportOptions | None, run: RunData) -> tuple[Profile | None, str | None]:
    """The run's own profile (its summary.json, run config or rows; ``--profile`` only
    when none of those resolves), and where it was named: what the rows' ``phase``
    numbers index (the cache ladder's rungs). (None, None) when none resolves."""
    candidates = _profile_candidates(options, run)
    own = [c for c in candidates if c[1] != "--profile"]
    return _resolve(own + [c for c in candidates if c[1] == "--profile"])


def run_slos(options: ReportOptions | None, run: RunData) -> tuple[dict, str]:
    """(class -> SLOs, where they came from): the profile named by ``--profile``, the
    run's summary.json, its run config or its rows, the first that resolves."""
    profile, source = _resolve(_profile_candidates(options, run))
    if profile is None:
        return {}, "none found (goodput counts finished requests only; pass --profile)"
    return (
        {
            c.name: {k: getattr(c.slo, k) for k in ("ttft_s", "tpot_s", "e2e_s")}
            for c in profile.classes
        },
        f"profile '{profile.name}' ({source})",
    )


def slos_known(slos: dict, frames: list[pl.DataFrame]) -> bool:
    """Whether any SLO applies to the rows' ``slo_met``: a target of the profile, or a
    per-row ``slo_*`` value (:func:`harness.records.request_stats.slo_met_expr`). Without
    one, ``slo_met`` is ``status == ok`` and goodput is the rate of finished requests."""
    if any(v is not None for s in slos.values() for v in s.values()):
        return True
    return any(
        c in f.columns and f[c].null_count() < f.height for f in frames for c in tables.SLO_COLUMNS
    )


def build_report(run_dirs: Sequence[Path | str], options: ReportOptions | None = None) -> Report:
    """The report of ``run_dirs``. Cells that cannot be used are left out and listed in
    ``broken``; :class:`ReportInputError` when no cell of any run can be used."""
    options = options or ReportOptions()
    runs = open_runs(run_dirs)
    report = Report(runs=[], options=options)
    for run in runs:
        report.runs.append(_build_run(run, options))
        report.broken += run.broken
        for data in run.policies.values():
            for m in data.missing:
                report.missing.append(f"{data.key}: {m}")
        report.missing += [f"{run.label}: {n}" for n in run.notes]
    if not any(rr.policies for rr in report.runs):
        raise ReportInputError(
            "no cell can be used: " + " | ".join(b.line() for b in report.broken)
        )
    # fcfs comparison needs every policy's groups first
    if options.figures:
        report.figures = _figures(report)
    return report


def _policy_report(data: PolicyData, slos: dict, options: ReportOptions) -> PolicyReport:
    """Everything of one cell that needs no other cell: its rows, groups, stalls and the
    engine facts the diagnosis reads."""
    frame = tables.load_requests(data.requests, slos)
    duration = tables.run_duration(frame, data.info)
    chosen = options.stall_threshold_s
    if chosen is None:
        chosen = stalls.stall_threshold(stalls.median_itl(frame))
    recorded = data.info.get("stall_threshold_s")
    note = None
    if recorded is None:
        recorded = STALL_FLOOR_S  # records never keep a gap below the engine's floor
    if chosen < recorded - 1e-12:
        note = (
            f"asked for {chosen:.3f} s but the records keep only gaps above "
            f"{recorded:.3f} s: using {recorded:.3f} s"
        )
        chosen = recorded
    attributed, sources = stalls.attribute(data, frame.select("request_id", "class"), chosen)
    groups = tables.policy_groups(frame, duration, attributed)
    starv = tables.starvation(groups, frame)
    facts = diagnosis.engine_facts(data, frame)
    policy = PolicyReport(
        data, frame, duration, chosen, note, attributed, sources, groups, starv, facts
    )
    policy.errors = _errors(data)
    policy.prefix_cache = prefix_cache.prefix_cache(data, frame)
    policy.sessions = sessions.sessions(frame, caching_on(policy))
    return policy


def caching_on(policy: PolicyReport) -> bool | None:
    """Whether the cell ran with the prefix cache (None: not recorded)."""
    return (policy.prefix_cache or {}).get("enabled")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _build_run(run: RunData, options: ReportOptions) -> RunReport:
    slos, slo_source = run_slos(options, run)
    policies: dict[str, PolicyReport] = {}
    for name, data in list(run.policies.items()):
        try:
            policies[name] = _policy_report(data, slos, options)
        except Exception as exc:
            # Files that passed their checks and still cannot be computed with (a page
            # that does not decode, a value of a shape no check foresaw): the cell's data
            # is at fault, so the cell is named and left out, as a broken one.
            run.broken.append(
                BrokenCell(run.label, name, data.path, [f"cannot be read: {_first_line(exc)}"])
            )
            del run.policies[name]
    any_frame = next(iter(policies.values())).frame if policies else None
    order = tables.class_sizes(any_frame) if any_frame is not None and any_frame.height else []
    short_class = order[0] if order else None
    long_class = order[-1] if len(order) >= 2 else None
    # Matrix cells (<policy>[-<knob set>][-x<rate>]) are compared within their group only.
    identities = {n: p.data.identity for n, p in policies.items()}
    groups = cell_groups(identities)
    v: dict = {}
    vs: list[dict] = []
    for group, names in groups.items():
        base = baseline(names, identities)
        fcfs_long = None
        base_starvation = policies[base].starvation if base is not None else None
        if base_starvation:
            fcfs_long = base_starvation.get("long_p99_queue_s")
        for name in names:
            p = policies[name]
            p.undiagnosed = diagnosis.unknown_facts(p.data)
            if p.undiagnosed is not None:
                continue  # not a clean cell: one whose facts are unknown
            try:
                p.findings = diagnosis.diagnose(
                    p.data,
                    p.frame,
                    p.stalls,
                    p.groups,
                    p.starvation,
                    p.facts,
                    None if name == base else fcfs_long,
                    rerun=diagnosis.rerun_info(
                        p.data.run_json, run.info, run.info.get("run_config")
                    ),
                )
                p.diagnosed = True
            except Exception as exc:  # the engine's records, not the report, are at fault
                p.data.missing.append(f"trap diagnosis not possible: {_first_line(exc)}")
        inputs = {
            n: {
                "frame": policies[n].frame,
                "duration_s": policies[n].duration_s,
                "starvation": policies[n].starvation,
                "generator_limited": policies[n].data.generator_limited,
            }
            for n in names
        }
        known = slos_known(slos, [policies[n].frame for n in names])
        for objective, entry in verdict.verdicts(
            inputs, short_class, options.resamples, options.seed, slos_known=known
        ).items():
            if len(groups) > 1:
                entry = {
                    **entry,
                    "group": group,
                    "sentence": f"[{group.lstrip('-') or 'base'}] {entry['sentence']}",
                }
            v[objective + group if len(groups) > 1 else objective] = entry
        if base is not None:
            vs += verdict.against_fcfs(
                inputs, short_class, long_class, options.resamples, options.seed, baseline=base
            )
    check = simulator_check.for_cells(
        {n: (p.data.path, p.frame) for n, p in policies.items()}, identities
    )
    profile, profile_source = run_profile(options, run)
    ladder = cache_ladder.cache_ladder(
        profile,
        profile_source,
        {n: (p.frame, caching_on(p)) for n, p in policies.items()},
    )
    return RunReport(run, slos, slo_source, policies, short_class, long_class, v, vs, check, ladder)


def _errors(data: PolicyData) -> dict:
    """The policy's failed requests grouped by message, with their HTTP statuses."""
    present = data.columns("requests")
    cols = [
        pl.col(c) if c in present else pl.lit(None, dtype).alias(c)
        for c, dtype in (("status", pl.String), ("error", pl.String), ("http_status", pl.Int64))
    ]
    return errors.error_summary(data.requests.select(cols).collect())


def _figures(report: Report) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    many = len(report.runs) > 1
    keyed = {}
    for rr in report.runs:
        for name, p in rr.policies.items():
            keyed[f"{rr.run.label}/{name}" if many else name] = p
    frames = {k: p.frame for k, p in keyed.items()}
    for metric, title in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency")):
        out.append(
            (
                "cdf",
                f"{title} CDF by class",
                figures.latency_cdfs(frames, metric, f"{title}: CDF by class"),
            )
        )
    # each run's time axes start at its schedule's start, on the engine's clock
    origins = {
        k: float(_engine_aligned(p.frame, np.array([figures.schedule_origin(p.frame)]))[0])
        for k, p in keyed.items()
    }
    for key, p in keyed.items():
        arrivals = p.frame["scheduled_at"].drop_nulls().to_numpy()
        arrivals = _engine_aligned(p.frame, arrivals)
        fig = figures.queue_timeline(key, p.data.steps, p.data.metrics, arrivals, origins[key])
        if fig is not None:
            out.append(("timeline", f"{key}: queue depth and KV usage", fig))
    for rr in report.runs:
        fig = figures.cache_ladder(rr.run.label, rr.cache_ladder) if rr.cache_ladder else None
        if fig is not None:
            out.append(("ladder", f"{rr.run.label}: cache ladder", fig))
    fig = figures.stalls_timeline({k: p.stalls for k, p in keyed.items()}, origins)
    if fig is not None:
        out.append(("stalls", "Stalls over time by cause", fig))
    for key, p in keyed.items():
        worst = (
            p.frame.filter((pl.col("status") == "ok") & pl.col("e2e_s").is_not_null())
            .sort("e2e_s", descending=True)
            .head(figures.WORST_REQUESTS)
        )
        intervals = figures.request_intervals(p.data.spans, worst)
        fig = figures.waterfall(key, worst, intervals, p.stalls)
        if fig is not None:
            out.append(("waterfall", f"{key}: the slowest requests", fig))
    return out


def _engine_aligned(frame: pl.DataFrame, arrivals: np.ndarray) -> np.ndarray:
    """Arrival instants on the engine's clock: the records' scheduled_at shifted by the
    median (first admission - queue wait - scheduled_at), which is 0 in a simulation and
    the clock epoch when client and engine clocks differ."""
    shift = frame.select(
        (pl.col("first_scheduled_at") - pl.col("queue_s") - pl.col("scheduled_at")).median()
    ).item()
    if shift is None or abs(shift) < 1.0:
        return arrivals
    return arrivals + shift
