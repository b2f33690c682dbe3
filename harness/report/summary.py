"""summary.json: the CI gate's input, version 2 (schema in docs/report.md).

The schema is ``harness/records/summary.py``'s (:func:`~harness.records.summary.report_summary`,
:func:`~harness.records.summary.report_policy`): version 2 keeps every key of version 1 (what
``schedscope simulate`` writes) for the first run — ``mode``, ``profile``, ``seed``,
``cost_model``, ``policies.<policy>.{overall, classes, starvation, config,
duration_s, stall_threshold_s, ...}`` — and adds ``runs.<label>`` (every run side by
side, with the info it was read with), ``verdicts``, ``against_fcfs``, ``diagnosis``
and, per group, ``itl_s``, ``stalls_by_cause``, ``stall_time_s``, ``generator_lag_s``,
``slo_met``; per policy ``prefix_cache`` and ``sessions`` (null when the cell has no
session rows); ``cache_ladder`` (the first run's, and each run's under ``runs``) only
for a run whose profile has prefix-reuse rungs. This module fills it from a built
:class:`~harness.report.build.Report`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.records.request_stats import STATISTICS
from harness.records.summary import report_policy, report_summary

if TYPE_CHECKING:
    from harness.report.build import PolicyReport, Report


def _policy(p: PolicyReport) -> dict:
    return report_policy(
        p.groups,
        p.starvation,
        p.duration_s,
        p.threshold_s,
        p.data.info,
        engine=p.facts,
        stall_sources=p.stall_sources,
        findings=[f["trap"] for f in p.findings],
        missing=p.data.missing,
        run_info=p.data.info,
        errors=p.errors,
        prompts=p.data.prompts,
        server_columns_source=p.data.server_source,
        prefix_cache=p.prefix_cache,
        sessions=p.sessions,
    )


def summary_json(report: Report) -> dict:
    runs = {}
    for rr in report.runs:
        info = {k: v for k, v in rr.run.info.items()}
        runs[rr.run.label] = {
            **info,
            "path": str(rr.run.path),
            "slo_source": rr.slo_source,
            "slos": rr.slos,
            "short_class": rr.short_class,
            "long_class": rr.long_class,
            "verdicts": rr.verdicts,
            "against_fcfs": rr.against_fcfs,
            "policies": {n: _policy(p) for n, p in rr.policies.items()},
            # Only when the run's profile has prefix-reuse rungs (harness/report/cache_ladder.py)
            **({"cache_ladder": rr.cache_ladder} if rr.cache_ladder else {}),
        }
    first = report.runs[0]
    # Only when the run has it: an old run's summary.json keeps its keys.
    check = {"simulator_check": first.simulator_check} if first.simulator_check else {}
    if first.cache_ladder:
        check["cache_ladder"] = first.cache_ladder
    return report_summary(
        first.run.info,
        runs[first.run.label]["policies"],
        runs=runs,
        run_labels=[rr.run.label for rr in report.runs],
        verdicts=first.verdicts,
        against_fcfs=first.against_fcfs,
        diagnosis=[
            {k: v for k, v in f.items()}
            for rr in report.runs
            for p in rr.policies.values()
            for f in p.findings
        ],
        # cells the trap rules could not be applied to: [{run, policy, why}]
        undiagnosed=[
            {"run": rr.run.label, "policy": n, "why": p.undiagnosed}
            for rr in report.runs
            for n, p in rr.policies.items()
            if p.undiagnosed is not None
        ],
        missing=report.missing,
        # cells left out because their records cannot be used: [{run, policy, path, problems}]
        broken=[b.to_dict() for b in report.broken],
        **check,
        options={
            "stall_threshold_s": report.options.stall_threshold_s,
            "profile": report.options.profile,
            "bootstrap_resamples": report.options.resamples,
            "bootstrap_seed": report.options.seed,
        },
    )


def flat_rows(report: Report) -> list[dict]:
    """classes.parquet: one numeric row per run x policy x class (``all`` included)."""
    rows = []
    for rr in report.runs:
        for name, p in rr.policies.items():
            for cls, g in [("all", p.groups["overall"]), *p.groups["classes"].items()]:
                row = {
                    "run": rr.run.label,
                    "policy": name,
                    "class": cls,
                    "requests": g["requests"],
                    **{f"n_{k}": v for k, v in g["counts"].items()},
                    "throughput_rps": g["throughput_rps"],
                    "output_tokens_per_s": g["output_tokens_per_s"],
                    "goodput_rps": g["goodput_rps"],
                    "slo_attainment": g["slo_attainment"],
                    "preempt_swaps": g["preemptions"]["swap"],
                    "preempt_recomputes": g["preemptions"]["recompute"],
                    "stalls": g["stalls"],
                    "stall_time_s": g["stall_time_s"],
                    "jain_index": g["jain_index"],
                    # requests cut in flight (None: records that cannot say, a simulation's)
                    "n_cut_in_flight": g.get("cut_in_flight"),
                    # "<metric>_<stat>" values that the cut requests bound from below
                    "lower_bounds": [],
                }
                for metric, dist in [*g["metrics"].items(), ("itl_s", g["itl_s"])]:
                    for stat in STATISTICS:
                        row[f"{metric}_{stat}"] = dist.get(stat)
                    row["lower_bounds"] += [f"{metric}_{s}" for s in dist.get("lower_bound", [])]
                for cause, v in g["stalls_by_cause"].items():
                    row[f"stall_s_{cause}"] = v["time_s"]
                rows.append(row)
    return rows
