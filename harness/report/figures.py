"""The report's pictures (Plotly; docs/report.md says why).

Every figure is reduced before plotting so its size does not grow with the run:
CDFs at ``CDF_POINTS`` quantiles, timelines in at most ``MAX_BINS`` time bins, the
waterfall of ten requests. A figure is a ``plotly.graph_objects.Figure``; ``render``
turns each into a ``<div>`` with one inline script (plotly.js itself is inlined once
per page by ``render.plotly_js``).

Time axes are seconds since the start of each run's schedule (``schedule_origin``, the
one home of that origin), so runs and policies served one after another line up; the
hover text keeps each point's absolute time (``absolute_times``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from harness.records.polars_types import as_float
from harness.report.stall_causes import CAUSE_LABELS, STALL_CAUSES

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Plotly is imported inside the functions that draw: every `schedscope` command imports
# this module (through harness.report), and only drawing needs Plotly; benchmarks/gpu.sh
# runs without it (docs/benchmarks.md).

CDF_POINTS = 201
MAX_BINS = 300
WORST_REQUESTS = 10
CAUSE_COLORS = {
    "swapped_out": "#d62728",
    "recompute": "#ff7f0e",
    "preempted_waiting": "#9467bd",
    "prefill_interference": "#1f77b4",
    "token_budget": "#2ca02c",
    "other": "#7f7f7f",
    "external_unknown": "#bcbd22",
}
INTERVAL_COLORS = {
    "queued": "#bbbbbb",
    "prefill": "#1f77b4",
    "recompute prefill": "#ff7f0e",
    "decode": "#2ca02c",
    "preempted": "#9467bd",
    "swapped": "#d62728",
}
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=40), height=420)
TIME_AXIS_TITLE = "seconds since the start of the schedule"
#: A clock reading at or past this (1973 in Unix seconds) is on an epoch's clock (Unix
#: time: served runs), not on a clock that starts with the run (the simulator's virtual
#: clock starts every policy at 0, the engine's own clock at its start).
EPOCH_LIKE_S = 1e8


def clock_origin(instants) -> float:
    """The origin of a run's instants when nothing better is known: 0 on a clock that
    starts with the run (nothing shifts), the earliest instant on an epoch's clock."""
    values = np.asarray(instants, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return 0.0
    first = float(values.min())
    return first if first >= EPOCH_LIKE_S else 0.0


def schedule_origin(frame: pl.DataFrame) -> float:
    """The instant a run's schedule started, on the clock of its ``scheduled_at``: the
    origin of every time axis of that run (one per run and policy).

    A served run's rows carry ``schedule_offset_s`` (the load generator's offset into
    the schedule; ``scheduled_at`` = the generator's start + offset, a closed loop's
    later): the start is min(``scheduled_at`` - ``schedule_offset_s``). Without offsets
    the clock decides (``clock_origin`` of ``scheduled_at``): a simulation's virtual
    clock is already seconds since its schedule started (origin 0, nothing changes);
    Unix instants start at the earliest arrival.
    """
    if "scheduled_at" not in frame.columns or frame.height == 0:
        return 0.0
    if "schedule_offset_s" in frame.columns:
        start = frame.select(
            (
                pl.col("scheduled_at").cast(pl.Float64)
                - pl.col("schedule_offset_s").cast(pl.Float64)
            ).min()
        ).item()
        if start is not None:
            return float(start)
    return clock_origin(frame["scheduled_at"].drop_nulls().cast(pl.Float64).to_numpy())


def absolute_times(instants) -> list[str]:
    """Hover labels of absolute instants: UTC ISO time (and the raw Unix seconds) on an
    epoch's clock, the raw clock reading on a run's own clock."""
    values = np.asarray(instants, dtype=float)
    if values.size == 0:
        return []
    finite = np.isfinite(values)
    # nanmin of no finite value warns (a RuntimeWarning on the report's console), and a
    # NaN cast to a date warns too: a missing instant is labelled as missing.
    if not finite.any() or values[finite].min() < EPOCH_LIKE_S:
        return [f"clock {v:.3f} s" if ok else "–" for v, ok in zip(values, finite, strict=True)]
    iso = _utc_iso(np.where(finite, values, 0.0))
    return [
        f"{t} (Unix {v:.3f})" if ok else "–" for t, v, ok in zip(iso, values, finite, strict=True)
    ]


def _utc_iso(values: np.ndarray) -> np.ndarray:
    """Unix seconds as UTC ISO 8601 times to the millisecond (``...T12:34:56.789Z``)."""
    ms = np.round(values * 1e3).astype("datetime64[ms]")
    return np.char.add(np.datetime_as_string(ms, unit="ms"), "Z")


def _time_axis_title(origin: float) -> str:
    if origin >= EPOCH_LIKE_S:
        return f"{TIME_AXIS_TITLE} (0 = {_utc_iso(np.array([origin]))[0]})"
    return TIME_AXIS_TITLE


def latency_cdfs(series: dict[str, pl.DataFrame], metric: str, title: str) -> go.Figure:
    """One subplot per class; a line per (run/)policy: the metric's empirical CDF."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    classes = sorted({c for f in series.values() for c in f["class"].unique().to_list()})
    fig = make_subplots(
        rows=1, cols=max(len(classes), 1), subplot_titles=classes, shared_yaxes=True
    )
    q = np.linspace(0, 1, CDF_POINTS)
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    for n, (key, frame) in enumerate(series.items()):
        for col, cls in enumerate(classes, 1):
            values = (
                frame.filter((pl.col("class") == cls) & (pl.col("status") == "ok"))[metric]
                .drop_nulls()
                .to_numpy()
            )
            if values.size == 0:
                continue
            fig.add_trace(
                go.Scatter(
                    x=np.quantile(values, q),
                    y=q,
                    mode="lines",
                    name=key,
                    legendgroup=key,
                    showlegend=col == 1,
                    line=dict(color=palette[n % len(palette)]),
                    hovertemplate=f"{key}<br>{metric}=%{{x:.4g}} s<br>P=%{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(
                title_text=f"{metric} (s)",
                type="log" if values.min() > 0 else "linear",
                row=1,
                col=col,
            )
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    fig.update_layout(title=title, **LAYOUT)
    return fig


def _bins(start: float, end: float) -> float:
    span = max(end - start, 1e-9)
    return max(span / MAX_BINS, 1.0) if span > MAX_BINS else max(span / MAX_BINS, 0.1)


def queue_timeline(
    name: str,
    steps: pl.LazyFrame | None,
    metrics: pl.LazyFrame | None,
    arrivals: np.ndarray,
    origin: float | None = None,
) -> go.Figure | None:
    """Waiting/running/swapped and KV usage over time, with the arrival rate.

    ``steps``, ``metrics`` and ``arrivals`` are instants on one clock; ``origin`` is the
    run's schedule start on it (``schedule_origin``), the axis's 0. ``None``: the
    ``clock_origin`` of the arrivals (else of the series).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    series = None
    if steps is not None:
        series = steps.select(
            pl.col("execute_end").alias("t"),
            pl.col("num_waiting").alias("waiting"),
            pl.col("num_running").alias("running"),
            pl.col("num_swapped").alias("swapped"),
            (1 - pl.col("num_free_device_blocks") / pl.col("num_device_blocks")).alias("kv_usage"),
        ).collect()
    elif metrics is not None:
        wanted = {
            "vllm:num_requests_waiting": "waiting",
            "vllm:num_requests_running": "running",
            "vllm:num_requests_swapped": "swapped",
            "vllm:kv_cache_usage_perc": "kv_usage",
        }
        m = (
            metrics.filter(pl.col("name").is_in(list(wanted)))
            .select("timestamp", "name", "value")
            .collect()
        )
        if m.height:
            series = (
                m.with_columns(pl.col("name").replace_strict(wanted))
                .pivot(on="name", index="timestamp", values="value", aggregate_function="mean")
                .rename({"timestamp": "t"})
            )
            for c in ("waiting", "running", "swapped", "kv_usage"):
                if c not in series.columns:
                    series = series.with_columns(pl.lit(None, pl.Float64).alias(c))
    if series is None or series.height == 0:
        return None
    t0, t1 = as_float(series["t"].min()), as_float(series["t"].max())
    if origin is None:
        origin = clock_origin(arrivals if arrivals.size else series["t"].to_numpy())
    width = _bins(t0, t1)
    binned = (
        series.with_columns(bin=((pl.col("t") - t0) / width).floor())
        .group_by("bin")
        .agg(pl.col("waiting", "running", "swapped").max(), pl.col("kv_usage").max())
        .sort("bin")
    )
    at = t0 + binned["bin"].to_numpy() * width
    x, when = at - origin, absolute_times(at)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if arrivals.size:
        a_width = max(1.0, width)
        counts, edges = np.histogram(
            arrivals, bins=np.arange(arrivals.min(), arrivals.max() + a_width, a_width)
        )
        fig.add_trace(
            go.Bar(
                x=edges[:-1] - origin,
                y=counts / a_width,
                name="arrivals (req/s)",
                marker_color="rgba(120,120,120,0.35)",
                offsetgroup="a",
                customdata=absolute_times(edges[:-1]),
                hovertemplate="arrivals %{y:.3g} req/s<br>%{x:.3f} s since the schedule "
                "started<br>%{customdata}<extra></extra>",
            ),
            secondary_y=False,
        )
    for col, color in (("waiting", "#d62728"), ("running", "#1f77b4"), ("swapped", "#9467bd")):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=binned[col].to_numpy(),
                name=f"{col} (max per bin)",
                mode="lines",
                line=dict(color=color),
                customdata=when,
                hovertemplate=f"{col} %{{y}}<br>%{{x:.3f}} s since the schedule started"
                "<br>%{customdata}<extra></extra>",
            ),
            secondary_y=False,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=binned["kv_usage"].to_numpy(),
            name="KV usage (0-1)",
            mode="lines",
            line=dict(color="#2ca02c", dash="dot"),
            customdata=when,
            hovertemplate="KV usage %{y:.3f}<br>%{x:.3f} s since the schedule started"
            "<br>%{customdata}<extra></extra>",
        ),
        secondary_y=True,
    )
    fig.update_yaxes(title_text="requests / requests per s", secondary_y=False)
    fig.update_yaxes(title_text="KV usage", range=[0, 1.05], secondary_y=True)
    fig.update_xaxes(title_text=_time_axis_title(origin))
    fig.update_layout(title=f"{name}: queue depth, KV usage and arrival rate", **LAYOUT)
    return fig


def stalls_timeline(
    stalls: dict[str, pl.DataFrame], origins: dict[str, float] | None = None
) -> go.Figure | None:
    """Stall seconds per time bin by cause (stacked), one row per policy.

    ``origins``: each key's schedule start on its stalls' clock (``schedule_origin``),
    the row's 0; a key without one gets the ``clock_origin`` of its stall starts.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    keys = [k for k, f in stalls.items() if f.height]
    if not keys:
        return None
    fig = make_subplots(
        rows=len(keys),
        cols=1,
        shared_xaxes=False,
        subplot_titles=keys,
        # plotly refuses a spacing above 1 / (rows - 1): a run of 12 cells has 12 rows
        vertical_spacing=min(0.12, 0.5 / (len(keys) - 1)) if len(keys) > 1 else 0.1,
    )
    for row, key in enumerate(keys, 1):
        frame = stalls[key]
        t0, t1 = as_float(frame["start_s"].min()), as_float(frame["start_s"].max())
        origin = (origins or {}).get(key)
        if origin is None:
            origin = clock_origin(frame["start_s"].to_numpy())
        width = _bins(t0, t1)
        binned = (
            frame.with_columns(bin=((pl.col("start_s") - t0) / width).floor())
            .group_by("bin", "cause")
            .agg(pl.col("duration_s").sum())
            .sort("bin")
        )
        for cause in STALL_CAUSES:
            part = binned.filter(pl.col("cause") == cause)
            if part.height == 0:
                continue
            at = t0 + part["bin"].to_numpy() * width
            fig.add_trace(
                go.Bar(
                    x=at - origin,
                    y=part["duration_s"].to_numpy(),
                    name=CAUSE_LABELS[cause],
                    legendgroup=cause,
                    showlegend=row == 1,
                    marker_color=CAUSE_COLORS[cause],
                    customdata=absolute_times(at),
                    hovertemplate=f"{key}: {CAUSE_LABELS[cause]} %{{y:.3f}} s<br>%{{x:.3f}} s "
                    "since the schedule started<br>%{customdata}<extra></extra>",
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="stall s", row=row, col=1)
    fig.update_xaxes(title_text=TIME_AXIS_TITLE, row=len(keys), col=1)
    fig.update_layout(
        barmode="stack",
        title="Stalls over time by cause",
        **{**LAYOUT, "height": max(300, 260 * len(keys))},
    )
    return fig


def request_intervals(spans: pl.LazyFrame | None, requests: pl.DataFrame) -> pl.DataFrame:
    """(request_id, kind, start, end) relative to each request's arrival, for ``requests``."""
    ids = requests["request_id"].to_list()
    schema = {"request_id": pl.String, "kind": pl.String, "start": pl.Float64, "end": pl.Float64}
    if spans is not None:
        names = spans.collect_schema().names()
        mode = (
            pl.col("attr.schedscope.preempt.mode")
            if "attr.schedscope.preempt.mode" in names
            else pl.lit(None, pl.String)
        )
        pkind = (
            pl.col("attr.schedscope.prefill.kind")
            if "attr.schedscope.prefill.kind" in names
            else pl.lit(None, pl.String)
        )
        s = (
            spans.filter(pl.col("request_id").is_in(ids))
            .select("request_id", "name", "start", "end", mode.alias("mode"), pkind.alias("pkind"))
            .collect()
        )
        if s.height:
            origin = (
                s.filter(pl.col("name") == "llm_request")
                .group_by("request_id")
                .agg(pl.col("start").min().alias("origin"))
            )
            interval_kind = (
                pl.when(pl.col("name") == "schedule")
                .then(pl.lit("queued"))
                .when((pl.col("name") == "prefill") & (pl.col("pkind") == "recompute"))
                .then(pl.lit("recompute prefill"))
                .when(pl.col("name") == "prefill")
                .then(pl.lit("prefill"))
                .when(pl.col("name") == "decode")
                .then(pl.lit("decode"))
                .when((pl.col("name") == "preempt") & (pl.col("mode") == "swap"))
                .then(pl.lit("swapped"))
                .when(pl.col("name") == "preempt")
                .then(pl.lit("preempted"))
                .otherwise(None)
            )
            intervals = (
                s.join(origin, on="request_id")
                .with_columns(kind=interval_kind)
                .filter(pl.col("kind").is_not_null())
                .select(
                    "request_id",
                    "kind",
                    (pl.col("start") - pl.col("origin")).alias("start"),
                    (pl.col("end") - pl.col("origin")).alias("end"),
                )
                .sort("request_id", "start")
            )
            # Spans with no interval of their own (vLLM's: one llm_request per request,
            # no child spans) leave the rows' instants to draw from.
            if intervals.height:
                return intervals
    rows = []
    for r in requests.iter_rows(named=True):
        arrival = r["scheduled_at"]
        marks = [
            ("queued", arrival, r["first_scheduled_at"]),
            ("prefill", r["first_scheduled_at"], r["first_token_at"]),
            ("decode", r["first_token_at"], r["finished_at"]),
        ]
        for kind, a, b in marks:
            if a is not None and b is not None and arrival is not None:
                rows.append((r["request_id"], kind, a - arrival, b - arrival))
    return pl.DataFrame(rows, schema=schema, orient="row")


def waterfall(
    name: str, worst: pl.DataFrame, intervals: pl.DataFrame, stalls: pl.DataFrame | None
) -> go.Figure | None:
    """The worst requests' intervals since arrival, one row each."""
    import plotly.graph_objects as go

    if worst.height == 0:
        return None
    labels = {
        r: f"{r} ({c}, {e:.2f} s)"
        for r, c, e in worst.select("request_id", "class", "e2e_s").iter_rows()
    }
    order = [labels[r] for r in worst["request_id"].to_list()][::-1]
    fig = go.Figure()
    for kind, color in INTERVAL_COLORS.items():
        part = intervals.filter(pl.col("kind") == kind)
        if part.height == 0:
            continue
        fig.add_trace(
            go.Bar(
                y=[labels[r] for r in part["request_id"].to_list()],
                x=(part["end"] - part["start"]).to_numpy(),
                base=part["start"].to_numpy(),
                orientation="h",
                name=kind,
                marker_color=color,
                hovertemplate=f"{kind}<br>%{{base:.3f}} s + %{{x:.3f}} s<extra></extra>",
            )
        )
    if stalls is not None and stalls.height:
        arrivals = dict(worst.select("request_id", "scheduled_at").iter_rows())
        own = stalls.filter(pl.col("request_id").is_in(list(labels)))
        if own.height:
            fig.add_trace(
                go.Scatter(
                    y=[labels[r] for r in own["request_id"].to_list()],
                    x=[
                        s - (arrivals.get(r) or 0.0)
                        for r, s in own.select("request_id", "start_s").iter_rows()
                    ],
                    mode="markers",
                    name="stall start",
                    marker=dict(symbol="x", color="black", size=8),
                    text=own["cause"].to_list(),
                    hovertemplate="stall: %{text}<br>at %{x:.3f} s<extra></extra>",
                )
            )
    fig.update_layout(
        barmode="overlay",
        title=f"{name}: the {worst.height} slowest requests (E2E)",
        **{**LAYOUT, "height": 140 + 34 * worst.height, "margin": dict(l=260, r=20, t=50, b=40)},
    )
    fig.update_yaxes(categoryorder="array", categoryarray=order)
    fig.update_xaxes(title_text="seconds since arrival")
    return fig


def tradeoff_front(
    points: list[dict], axes: list[tuple[str, str]], value_title: str, title: str
) -> go.Figure:
    """``schedscope tune``'s Pareto front: one subplot per (class, target) axis, the
    target's value at the profile's rate on x, the objective (``value_title``) on y.
    ``points``: {"label", "value", "tails": class -> target -> s, "kind": "front" |
    "trial" | "current"}; the front's points are joined in order of x."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=max(len(axes), 1),
        subplot_titles=[f"{c}: {name}" for c, name in axes],
        shared_yaxes=True,
    )
    styles = {
        "trial": dict(mode="markers", marker=dict(color="#bbbbbb", size=6)),
        "front": dict(mode="lines+markers", marker=dict(color="#d62728", size=9)),
        "current": dict(mode="markers", marker=dict(color="#1f77b4", size=12, symbol="star")),
    }
    for col, (cls, name) in enumerate(axes, 1):
        for kind, style in styles.items():
            chosen = [
                p
                for p in points
                if p["kind"] == kind and p["tails"].get(cls, {}).get(name) is not None
            ]
            chosen.sort(key=lambda p: p["tails"][cls][name])
            if not chosen:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[p["tails"][cls][name] for p in chosen],
                    y=[p["value"] for p in chosen],
                    text=[p["label"] for p in chosen],
                    name=kind,
                    legendgroup=kind,
                    showlegend=col == 1,
                    hovertemplate=f"%{{text}}<br>{name}=%{{x:.4g}} s<br>"
                    f"{value_title}=%{{y:.4g}}<extra></extra>",
                    **style,
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text=f"{name} at the profile's rate (s)", row=1, col=col)
    fig.update_yaxes(title_text=value_title, row=1, col=1)
    fig.update_layout(title=title, **LAYOUT)
    return fig


def cache_ladder(label: str, ladder: dict) -> go.Figure | None:
    """A run's cache ladder (harness/report/cache_ladder.py): its rungs on x (in the
    profile's order), TTFT p50 (solid) and p95 (dashed) in ms on the left axis and the
    hit rate (dotted, %) on the right, one colour per policy. None when no policy has a
    rung's figures."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if not ladder.get("policies"):
        return None
    names = [r["name"] for r in ladder["rungs"]]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    for n, (policy, by_rung) in enumerate(ladder["policies"].items()):
        color = palette[n % len(palette)]
        rungs = [by_rung[name] for name in names]
        for stat, dash in (("p50", "solid"), ("p95", "dash")):
            values = [r["ttft_s"].get(stat) for r in rungs]
            fig.add_trace(
                go.Scatter(
                    x=names,
                    y=[None if v is None else v * 1000 for v in values],
                    mode="lines+markers",
                    name=f"{policy} TTFT {stat}",
                    legendgroup=policy,
                    line=dict(color=color, dash=dash),
                    customdata=[r["ttft_s"].get("count", 0) for r in rungs],
                    hovertemplate=f"{policy}<br>%{{x}}: TTFT {stat} %{{y:.1f}} ms"
                    "<br>over %{customdata} requests<extra></extra>",
                ),
                secondary_y=False,
            )
        hits = [r["hit_rate"] for r in rungs]
        fig.add_trace(
            go.Scatter(
                x=names,
                y=[None if v is None else v * 100 for v in hits],
                mode="lines+markers",
                name=f"{policy} hit rate",
                legendgroup=policy,
                line=dict(color=color, dash="dot"),
                marker=dict(symbol="diamond"),
                customdata=[r["hit_rate_requests"] for r in rungs],
                hovertemplate=f"{policy}<br>%{{x}}: hit rate %{{y:.1f}}%"
                "<br>over %{customdata} admitted requests<extra></extra>",
            ),
            secondary_y=True,
        )
    fig.update_xaxes(title_text="rung (the profile's phases with prefix_reuse)")
    fig.update_yaxes(title_text="TTFT (ms)", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(
        title_text="hit rate (%)",
        range=[0, 100],
        tickmode="linear",
        dtick=20,
        showgrid=False,
        secondary_y=True,
    )
    fig.update_layout(title=f"{label}: TTFT and hit rate per rung", **LAYOUT)
    return fig
