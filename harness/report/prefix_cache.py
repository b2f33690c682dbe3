"""The prefix cache of each cell (docs/report.md, "Prefix cache"): its hit rate per
class, the TTFT of requests that found a cached prefix beside those that did not, and
what the cache lost for want of room.

- **Per request** (``requests.parquet``): the hit rate of a group is
  Σ ``cached_tokens`` / Σ ``prompt_tokens`` over its requests that were admitted (a
  first admission: ``first_scheduled_at`` known, or, where the engine's rows are not
  joined, a finished request) and whose ``cached_tokens`` is known: the bundled
  engine's count at the first admission, or an external target's
  ``usage.prompt_tokens_details.cached_tokens`` where it sent one. A group without
  any such request has no hit rate (null, "not recorded"), never 0.
- **Over the run** (``steps.parquet``): the blocks the cache evicted
  (``num_evicted_blocks``); (``requests.parquet``) the prompt tokens just after each
  admission's hits that the cache had held and evicted (``evicted_prefix_tokens``).
- **The target's counters** (``metrics.parquet``, an external engine's or the bundled
  one's ``/metrics`` scraped over the cell): cumulative, so each is taken as its
  increase between the cell's first and last scrape (:func:`counter_increase`), never
  its value. The first pair the scrapes hold, in :data:`COUNTER_PAIRS`' order, gives
  the rate: ``vllm:prompt_tokens_cached_total`` / ``vllm:prompt_tokens_total``, then
  ``vllm:prompt_tokens_by_source_total`` (cached sources over all), then
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (vLLM V1
  counts a waiting request's query again at every step it fails admission, so this
  rate can be off: said in ``note``).

:func:`prefix_cache` gives summary.json's ``prefix_cache`` entry of a policy, or None
when nothing about the cache is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl

from harness.records.request_stats import clean, known_sum, percentile
from harness.report.inputs import PolicyData

#: Where a group's per-request hit rate comes from.
REQUEST_SOURCE = "requests.parquet cached_tokens (admitted requests)"
#: What summary.json and the report say of a cell whose engine ran without the cache.
CACHING_OFF = "prefix caching off"


@dataclass(frozen=True)
class CounterPair:
    """A hit rate from two of the target's cumulative counters: ``cached`` over
    ``total``, each summed over its series whose labels carry ``*_labels`` (a label
    name -> the values allowed; None: every series)."""

    cached: str
    total: str
    cached_labels: dict | None = None
    total_labels: dict | None = None
    #: What the rate is worth, when it needs saying.
    note: str | None = None

    @property
    def text(self) -> str:
        """How the report names the pair (``used``)."""
        if self.cached == self.total:
            wanted = ", ".join(v for vs in (self.cached_labels or {}).values() for v in vs)
            return f"{self.cached}: the cached sources ({wanted}) over all"
        return f"{self.cached} / {self.total}"


#: The target's hit-rate counters, the preferred first.
COUNTER_PAIRS = (
    CounterPair("vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total"),
    CounterPair(
        "vllm:prompt_tokens_by_source_total",
        "vllm:prompt_tokens_by_source_total",
        cached_labels={"source": ("local_cache_hit", "external_kv_transfer")},
    ),
    CounterPair(
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        note="vLLM V1 counts a waiting request's query (and its hits) again at every step "
        "it fails admission, so this rate can be off under queueing",
    ),
)
#: The target's cache config (vLLM's and the bundled engine's ``/metrics``).
CACHE_CONFIG_INFO = "vllm:cache_config_info"


def _labels_match(labels: dict, wanted: dict | None) -> bool:
    """Whether ``labels`` carries every wanted label with one of its allowed values."""
    return all(labels.get(key) in allowed for key, allowed in (wanted or {}).items())


def _series(metrics: pl.LazyFrame, name: str, wanted: dict | None) -> pl.DataFrame:
    """``name``'s samples (timestamp, labels, value) whose labels match ``wanted``."""
    names = metrics.collect_schema().names()
    labels = pl.col("labels") if "labels" in names else pl.lit("{}")
    rows = (
        metrics.filter(pl.col("name") == name)
        .select(
            pl.col("timestamp").cast(pl.Float64),
            labels.cast(pl.String).fill_null("{}").alias("labels"),
            pl.col("value").cast(pl.Float64),
        )
        .drop_nulls()
        .collect()
    )
    if wanted:
        keep = []
        for text in rows["labels"].unique().to_list():
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            if isinstance(parsed, dict) and _labels_match(parsed, wanted):
                keep.append(text)
        rows = rows.filter(pl.col("labels").is_in(keep))
    return rows


def counter_increase(
    metrics: pl.LazyFrame, name: str, wanted: dict | None = None, start: float | None = None
) -> float | None:
    """How much the cumulative counter ``name`` rose over the scrapes, summed over its
    series (label sets; only those carrying ``wanted``): each series' rise from its value
    at the first scrape to its value at the last, where a drop is a restart of the target
    (the counter counted again from 0: the value after the drop is all rise, as
    Prometheus' ``increase()`` takes it), and a series first seen after ``start`` (the
    first scrape of the cell, by default the counter's own first) counts from 0 (it did
    not exist yet). None when fewer than two scrapes hold the counter."""
    rows = _series(metrics, name, wanted)
    if rows.height == 0 or rows["timestamp"].n_unique() < 2:
        return None
    first = rows["timestamp"].min() if start is None else start
    diff = pl.col("value").diff()
    rises = (
        rows.sort("timestamp")
        .group_by("labels", maintain_order=True)
        .agg(
            pl.when(diff < 0).then(pl.col("value")).otherwise(diff).sum().alias("rise"),
            pl.col("timestamp").first().alias("seen"),
            pl.col("value").first().alias("initial"),
        )
        .with_columns(
            # a series that was not there at the first scrape was 0 then
            pl.when(pl.col("seen") > first)
            .then(pl.col("rise") + pl.col("initial"))
            .otherwise(pl.col("rise"))
            .alias("rise")
        )
    )
    return float(rises["rise"].sum())


def target_counters(metrics: pl.LazyFrame | None) -> dict | None:
    """The hit rate over the load from the target's cumulative counters: the first pair
    of :data:`COUNTER_PAIRS` that the scrapes hold (its increase between the first and
    last scrape; :func:`counter_increase`), with every pair's rate beside it (``rates``)
    and the scrapes' span. None without two scrapes of any pair."""
    if metrics is None:
        return None
    span = metrics.select(
        pl.col("timestamp").min().alias("first"),
        pl.col("timestamp").max().alias("last"),
        pl.col("timestamp").n_unique().alias("scrapes"),
    ).collect()
    if span.height == 0 or span["scrapes"][0] < 2:
        return None
    start = float(span["first"][0])
    rates: dict[str, dict] = {}
    for pair in COUNTER_PAIRS:
        cached = counter_increase(metrics, pair.cached, pair.cached_labels, start)
        total = counter_increase(metrics, pair.total, pair.total_labels, start)
        if cached is None or total is None:
            continue
        rates[pair.text] = {
            "cached_tokens": clean(cached),
            "prompt_tokens": clean(total),
            "hit_rate": clean(cached / total) if total > 0 else None,
            "note": pair.note,
        }
    if not rates:
        return None
    used = next(iter(rates))
    return {
        "used": used,
        **rates[used],
        "first_scrape": clean(start),
        "last_scrape": clean(float(span["last"][0])),
        "scrapes": int(span["scrapes"][0]),
        "rates": rates,
    }


def enabled(data: PolicyData) -> tuple[bool | None, str | None]:
    """(whether the cell's engine ran with prefix caching, where that was read): its
    engine config, else the target's ``vllm:cache_config_info`` label; (None, None)
    when neither says."""
    cache = data.config.get("cache") or {}
    value = cache.get("enable_prefix_caching") if isinstance(cache, dict) else None
    if isinstance(value, bool):
        return value, "engine config"
    if data.metrics is not None:
        rows = _series(data.metrics, CACHE_CONFIG_INFO, None)
        for text in rows.sort("timestamp", descending=True)["labels"].to_list():
            try:
                labels = json.loads(text)
            except ValueError:
                continue
            flag = labels.get("enable_prefix_caching") if isinstance(labels, dict) else None
            if isinstance(flag, str) and flag.lower() in ("true", "false"):
                return flag.lower() == "true", CACHE_CONFIG_INFO
    return None, None


def admitted_known(frame: pl.DataFrame) -> pl.DataFrame:
    """The requests a hit rate is over: admitted (``first_scheduled_at`` known, or
    finished ``ok`` where no engine row says when) with ``cached_tokens`` and
    ``prompt_tokens`` known."""
    admitted = pl.col("first_scheduled_at").is_not_null() | (pl.col("status") == "ok")
    return frame.filter(
        admitted & pl.col("cached_tokens").is_not_null() & pl.col("prompt_tokens").is_not_null()
    )


def _ttft(rows: pl.DataFrame) -> dict:
    values = rows.filter(pl.col("ttft_s").is_not_null())["ttft_s"].to_numpy()
    return {
        "count": int(values.size),
        "p50": clean(percentile(values, 50)) if values.size else None,
        "p95": clean(percentile(values, 95)) if values.size else None,
    }


def group(rows: pl.DataFrame) -> dict:
    """One group's figures over ``rows`` (:func:`admitted_known` rows of a class, or of
    every class): the hit rate, its tokens, and TTFT p50/p95 of the finished requests
    with a hit (``cached_tokens`` > 0) and without. ``recorded`` False (every figure
    null) when no row is there."""
    prompt = int(rows["prompt_tokens"].sum()) if rows.height else 0
    cached = int(rows["cached_tokens"].sum()) if rows.height else 0
    ok = rows.filter(pl.col("status") == "ok")
    hit, miss = (
        _ttft(ok.filter(pl.col("cached_tokens") > 0)),
        _ttft(ok.filter(pl.col("cached_tokens") == 0)),
    )
    recorded = rows.height > 0
    return {
        "recorded": recorded,
        "requests": rows.height,
        "requests_with_hit": int((rows["cached_tokens"] > 0).sum()) if recorded else 0,
        "prompt_tokens": prompt if recorded else None,
        "cached_tokens": cached if recorded else None,
        "hit_rate": clean(cached / prompt) if recorded and prompt > 0 else None,
        "ttft_hit_p50_s": hit["p50"],
        "ttft_hit_p95_s": hit["p95"],
        "ttft_hit_count": hit["count"],
        "ttft_miss_p50_s": miss["p50"],
        "ttft_miss_p95_s": miss["p95"],
        "ttft_miss_count": miss["count"],
        "evicted_prefix_tokens": known_sum(rows, "evicted_prefix_tokens") if recorded else None,
    }


def evicted_blocks(data: PolicyData) -> int | None:
    """Blocks the cache evicted over the run (steps.parquet); None without the column."""
    if data.steps is None or "num_evicted_blocks" not in data.columns("steps"):
        return None
    value = data.steps.select(pl.col("num_evicted_blocks").sum()).collect().item()
    return None if value is None else int(value)


def prefix_cache(data: PolicyData, frame: pl.DataFrame) -> dict | None:
    """summary.json's ``prefix_cache`` of one cell (``frame``: its request rows,
    :func:`harness.report.tables.load_requests`), or None when nothing about its
    prefix cache is known (no config saying, no cached_tokens, no counters)."""
    on, on_source = enabled(data)
    counters = target_counters(data.metrics)
    known = admitted_known(frame)
    blocks = evicted_blocks(data)
    out: dict = {
        "enabled": on,
        "enabled_source": on_source,
        "source": None,
        "hit_rate": None,
        "overall": None,
        "by_class": {},
        "evicted_blocks": blocks,
        "evicted_prefix_tokens": None,
        "counters": counters,
    }
    if on is False:
        out["note"] = CACHING_OFF
        return out
    if known.height:
        out["overall"] = group(known)
        out["source"] = REQUEST_SOURCE
        out["hit_rate"] = out["overall"]["hit_rate"]
        out["evicted_prefix_tokens"] = out["overall"]["evicted_prefix_tokens"]
        for name in sorted(frame["class"].unique().to_list()):
            out["by_class"][name] = group(known.filter(pl.col("class") == name))
    elif counters is not None:
        out["source"] = f"metrics.parquet: {counters['used']} (increase over the load)"
        out["hit_rate"] = counters["hit_rate"]
    if on is None and out["source"] is None and blocks is None:
        return None
    return out
