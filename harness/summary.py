"""``summary.json``: what the gate reads — per policy x class x metric percentiles,
throughput, goodput, counts. Computed with Polars from ``requests.parquet`` rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from harness.profiles import Profile

SUMMARY_SCHEMA_VERSION = 1
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "max_itl_s", "queue_s", "stall_s")
PERCENTILES = (50, 90, 95, 99)


def _clean(value):
    """JSON-safe floats: NaN/inf become None; numbers rounded to 9 significant digits
    so the file is stable and readable."""
    if value is None:
        return None
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return float(f"{value:.9g}")
    return value


def _distribution(series: pl.Series) -> dict:
    values = series.drop_nulls()
    if values.len() == 0:
        return {"count": 0}
    out = {"count": values.len(), "mean": _clean(values.mean()), "max": _clean(values.max())}
    for p in PERCENTILES:
        out[f"p{p}"] = _clean(values.quantile(p / 100, interpolation="linear"))
    return out


def _meets_slo(frame: pl.DataFrame, slos: dict[str, dict]) -> pl.Series:
    """Per row: finished ok and within every SLO its class sets."""
    ok = frame["status"] == "ok"
    met = []
    for row_class, ttft, tpot, e2e, good in zip(
        frame["class"], frame["ttft_s"], frame["tpot_s"], frame["e2e_s"], ok, strict=True
    ):
        slo = slos.get(row_class, {})
        passed = good
        for limit_name, value in (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e)):
            limit = slo.get(limit_name)
            if passed and limit is not None and value is not None and value > limit:
                passed = False
        met.append(passed)
    return pl.Series(met, dtype=pl.Boolean)


def jain_index(values: pl.Series) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 is perfectly even."""
    values = values.drop_nulls()
    if values.len() == 0:
        return None
    total_sq = float((values * values).sum())
    if total_sq == 0:
        return 1.0
    return float(values.sum()) ** 2 / (values.len() * total_sq)


def group_summary(frame: pl.DataFrame, duration_s: float, slos: dict[str, dict]) -> dict:
    """Counts, throughput, goodput, latency distributions and fairness for ``frame``."""
    ok = frame.filter(pl.col("status") == "ok")
    counts = {s: int((frame["status"] == s).sum()) for s in ("ok", "error", "rejected", "aborted")}
    duration = max(duration_s, 1e-9)
    good = int(_meets_slo(frame, slos).sum()) if frame.height else 0
    summary = {
        "requests": frame.height,
        "counts": counts,
        "throughput_rps": _clean(counts["ok"] / duration),
        "output_tokens_per_s": _clean(float(ok["output_tokens"].sum()) / duration),
        "goodput_rps": _clean(good / duration),
        "slo_attainment": _clean(good / frame.height) if frame.height else None,
        "metrics": {m: _distribution(ok[m]) for m in LATENCY_METRICS if m in ok.columns},
        "preemptions": {
            "swap": int(frame["preempt_swaps"].sum()),
            "recompute": int(frame["preempt_recomputes"].sum()),
        },
        "recomputed_tokens": int(frame["recomputed_tokens"].sum()),
        "swapped_s": _clean(float(frame["swapped_s"].sum())),
        "idle_running_steps": int(frame["idle_running_steps"].sum()),
        "stalls": int(frame["num_stalls"].sum()),
    }
    normalized = (ok["e2e_s"] / ok["output_tokens"].cast(pl.Float64)) if ok.height else ok["e2e_s"]
    summary["jain_index"] = _clean(jain_index(normalized))
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
        out["classes"][name] = group_summary(frame.filter(pl.col("class") == name), duration_s, slos)
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
            "ratio_p99_queue": _clean(p_long / p_short) if p_short and p_long is not None else None,
        }
    if extra:
        out.update(extra)
    return out


def _mean_job_tokens(frame: pl.DataFrame, class_name: str) -> float:
    rows = frame.filter(pl.col("class") == class_name)
    return float((rows["prompt_tokens"] + rows["max_tokens"]).mean() or 0.0)


def write_summary(path: Path, summary: dict) -> None:
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
