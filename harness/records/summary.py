"""``summary.json``: what the gate reads. The one definition of its schema, both versions:
the version numbers, the keys and how each is computed.

Version 1 (:data:`SUMMARY_SCHEMA_VERSION`) is what ``schedscope simulate`` and each
``schedscope run`` cell write (:func:`run_summary`): the run's keys (:data:`RUN_KEYS`)
and, per policy, the statistics of :func:`policy_summary` — per policy x class x metric
percentiles, throughput, goodput, counts, computed with Polars from
``requests.parquet`` rows — next to the policy's run information
(:data:`POLICY_RUN_INFO_KEYS`, :func:`policy_run_info`).

Version 2 (:data:`REPORT_SCHEMA_VERSION`) is what ``schedscope report`` writes
(:func:`report_summary`, :func:`report_policy`; docs/report.md): every key of version 1
for the first run, so a gate reads either, plus the report's own.
``harness/report/summary.py`` supplies the report's values.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from harness.profiles import Profile
from harness.records.polars_types import as_float
from harness.records.request_stats import clean, group_statistics, slo_met_expr

SUMMARY_SCHEMA_VERSION = 1
REPORT_SCHEMA_VERSION = 2
#: Version 2's ``kind``: a report's summary, as opposed to a run's.
REPORT_KIND = "schedscope-report"
#: The run's keys of version 1 (in version 2: the first run's, those it knows).
RUN_KEYS = ("mode", "profile", "seed", "cost_model", "machine")
#: A policy's run information, kept next to its statistics: what the report reads back
#: from a version-1 summary (harness/report/inputs.py) and carries into version 2.
POLICY_RUN_INFO_KEYS = (
    "config",
    "duration_s",
    "stall_threshold_s",
    "num_steps",
    "step_stats",
    "kv_cache",
    "tracing",
    "faults",
)
#: Run information version 2 states as the report used it, not as recorded.
_REPORT_OWN_RUN_INFO = ("duration_s", "stall_threshold_s")


def group_summary(frame: pl.DataFrame, duration_s: float, slos: dict[str, dict]) -> dict:
    """:func:`~harness.records.request_stats.group_statistics` of ``frame`` (goodput
    against ``slos``), with the stalls its rows count."""
    met = frame.select(slo_met_expr(frame.columns, slos)).to_series()
    summary = group_statistics(frame, duration_s, met)
    summary["stalls"] = int(frame["num_stalls"].sum())
    return summary


def policy_summary(
    frame: pl.DataFrame, duration_s: float, profile: Profile, extra: dict | None = None
) -> dict:
    """One policy of a version-1 summary.json: ``overall`` and per-class ``classes``
    groups (:func:`group_summary`, goodput against ``profile``'s SLOs), ``starvation``
    when ``profile`` has two or more of the classes present, then ``extra`` (the
    policy's run information, :func:`policy_run_info`)."""
    slos = {
        c.name: {k: getattr(c.slo, k) for k in ("ttft_s", "tpot_s", "e2e_s")}
        for c in profile.classes
    }
    out = {"overall": group_summary(frame, duration_s, slos), "classes": {}}
    for name in sorted(frame["class"].unique().to_list()):
        out["classes"][name] = group_summary(
            frame.filter(pl.col("class") == name), duration_s, slos
        )
    # Starvation: p99 queue wait of the longest class over the shortest (by mean prompt+output).
    sizes = {c.name: c for c in profile.classes}
    present = [n for n in out["classes"] if n in sizes]
    if len(present) >= 2:
        by_size = sorted(present, key=lambda n: _mean_job_tokens(frame, n))
        short, long = by_size[0], by_size[-1]
        p_short = out["classes"][short]["metrics"].get("queue_s", {}).get("p99")
        p_long = out["classes"][long]["metrics"].get("queue_s", {}).get("p99")
        out["starvation"] = {
            "short_class": short,
            "long_class": long,
            "ratio_p99_queue": clean(p_long / p_short) if p_short and p_long is not None else None,
        }
    if extra:
        out.update(extra)
    return out


def _mean_job_tokens(frame: pl.DataFrame, class_name: str) -> float:
    rows = frame.filter(pl.col("class") == class_name)
    return as_float((rows["prompt_tokens"] + rows["max_tokens"]).mean() or 0.0)


def policy_run_info(
    *,
    duration_s: float,
    stall_threshold_s: float,
    config: dict | None = None,
    num_steps: int | None = None,
    step_stats: dict | None = None,
    kv_cache: str | None = None,
    tracing: dict | None = None,
    faults: dict | None = None,
) -> dict:
    """A policy's run information for :func:`policy_summary`'s ``extra``: its keys are
    :data:`POLICY_RUN_INFO_KEYS`; one whose value is None (a served cell has no step
    stats, a --target cell no engine config) is left out, not written as null.
    ``faults``: the faults planted into the engine (``engine.faults``), given only when
    some were."""
    values = {
        "config": config,
        "duration_s": duration_s,
        "stall_threshold_s": stall_threshold_s,
        "num_steps": num_steps,
        "step_stats": step_stats,
        "kv_cache": kv_cache,
        "tracing": tracing,
        "faults": faults,
    }
    return {k: v for k, v in values.items() if v is not None}


def run_summary(
    mode: str,
    profile: str,
    seed: int | None,
    policies: dict,
    cost_model: dict | None = None,
    machine: dict | None = None,
) -> dict:
    """A version-1 summary.json: the run's keys and ``policies`` (policy name ->
    :func:`policy_summary`). ``cost_model`` (the simulator's) is left out when None:
    a served run has none. ``machine``: the fingerprint of the machine the run ran on
    (or, simulated, the machine whose steps the cost model stands for;
    :mod:`harness.costmodel.machine`), left out when None."""
    out = {"schema_version": SUMMARY_SCHEMA_VERSION, "mode": mode, "profile": profile, "seed": seed}
    if cost_model is not None:
        out["cost_model"] = cost_model
    if machine is not None:
        out["machine"] = machine
    out["policies"] = policies
    return out


def report_policy(
    groups: dict,
    starvation: dict | None,
    duration_s: float,
    stall_threshold_s: float,
    recorded: dict,
    **report_keys,
) -> dict:
    """One policy of a version-2 summary.json.

    Version 1's keys: ``overall`` and ``classes`` (``groups``, the report's: version 1's
    group keys plus its own), ``starvation`` (null with fewer than two classes),
    ``duration_s`` and ``stall_threshold_s`` as the report used them (9 significant
    digits) and every other :data:`POLICY_RUN_INFO_KEYS` entry of ``recorded`` (the run
    information read back) as it is. Then the report's own ``report_keys``.
    """
    out = {
        "overall": groups["overall"],
        "classes": groups["classes"],
        "starvation": starvation,
        "duration_s": clean(duration_s),
        "stall_threshold_s": clean(stall_threshold_s),
        **report_keys,
    }
    for key in POLICY_RUN_INFO_KEYS:
        if key in recorded and key not in _REPORT_OWN_RUN_INFO:
            out[key] = recorded[key]
    return out


def report_summary(first_run_info: dict, policies: dict, **report_keys) -> dict:
    """A version-2 summary.json: the first run's :data:`RUN_KEYS` (those
    ``first_run_info`` has), its ``policies`` (policy name -> :func:`report_policy`),
    ``schema_version`` 2 and ``kind``, then the report's own ``report_keys`` (``runs``,
    ``verdicts``, ``diagnosis`` ...)."""
    out = {k: v for k, v in first_run_info.items() if k in RUN_KEYS}
    out.update(
        {
            "schema_version": REPORT_SCHEMA_VERSION,
            "kind": REPORT_KIND,
            "policies": policies,
            **report_keys,
        }
    )
    return out


def write_summary(path: Path, summary: dict) -> None:
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
