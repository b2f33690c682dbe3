"""``summary.json``: what the gate reads — per policy x class x metric percentiles,
throughput, goodput, counts. Computed with Polars from ``requests.parquet`` rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from harness.profiles import Profile
from harness.request_stats import clean, jain_index, slo_met_expr

SUMMARY_SCHEMA_VERSION = 1
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "max_itl_s", "queue_s", "stall_s")
PERCENTILES = (50, 90, 95, 99)


def _distribution(series: pl.Series) -> dict:
    values = series.drop_nulls()
    if values.len() == 0:
        return {"count": 0}
    out = {"count": values.len(), "mean": clean(values.mean()), "max": clean(values.max())}
    for p in PERCENTILES:
        out[f"p{p}"] = clean(values.quantile(p / 100, interpolation="linear"))
    return out


def group_summary(frame: pl.DataFrame, duration_s: float, slos: dict[str, dict]) -> dict:
    """Counts, throughput, goodput, latency distributions and fairness for ``frame``."""
    ok = frame.filter(pl.col("status") == "ok")
    counts = {s: int((frame["status"] == s).sum()) for s in ("ok", "error", "rejected", "aborted")}
    duration = max(duration_s, 1e-9)
    good = (
        int(frame.select(slo_met_expr(frame.columns, slos)).to_series().sum())
        if frame.height
        else 0
    )
    summary = {
        "requests": frame.height,
        "counts": counts,
        "throughput_rps": clean(counts["ok"] / duration),
        "output_tokens_per_s": clean(float(ok["output_tokens"].sum()) / duration),
        "goodput_rps": clean(good / duration),
        "slo_attainment": clean(good / frame.height) if frame.height else None,
        "metrics": {m: _distribution(ok[m]) for m in LATENCY_METRICS if m in ok.columns},
        "preemptions": {
            "swap": int(frame["preempt_swaps"].sum()),
            "recompute": int(frame["preempt_recomputes"].sum()),
        },
        "recomputed_tokens": int(frame["recomputed_tokens"].sum()),
        "swapped_s": clean(float(frame["swapped_s"].sum())),
        "idle_running_steps": int(frame["idle_running_steps"].sum()),
        "stalls": int(frame["num_stalls"].sum()),
    }
    normalized = (ok["e2e_s"] / ok["output_tokens"].cast(pl.Float64)) if ok.height else ok["e2e_s"]
    summary["jain_index"] = clean(jain_index(normalized))
    return summary


def policy_summary(
    frame: pl.DataFrame, duration_s: float, profile: Profile, extra: dict | None = None
) -> dict:
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
    return float((rows["prompt_tokens"] + rows["max_tokens"]).mean() or 0.0)


def write_summary(path: Path, summary: dict) -> None:
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
