"""A ``--target`` cell's server-side columns from the target's own spans: vLLM's
``llm_request`` span, one per request, joined to requests.parquet by request id.

vLLM (0.32, ``OutputProcessor.do_tracing`` in vllm/v1/engine/output_processor.py) opens
the span at the request's arrival (its frontend's wall clock, ``time.time()``: the
client's clock on one machine) and sets, in seconds:

- ``gen_ai.latency.time_in_queue``: first scheduling − entry into the engine core's
  queue (``scheduled_ts − queued_ts``; a preempted request's later waits are not in it):
  schedscope's ``queue_s`` (docs/metrics.md: first admission − arrival at the engine);
- ``gen_ai.latency.time_to_first_token``: first token − arrival (``engine_ttft_s``);
- ``gen_ai.latency.e2e``: the last output − arrival (``engine_e2e_s``);
- ``gen_ai.latency.time_in_model_prefill``: first token − first scheduling;
- ``gen_ai.usage.prompt_tokens`` / ``gen_ai.usage.completion_tokens``
  (``engine_prompt_tokens`` / ``engine_output_tokens``).

The instants follow on the Unix clock: ``engine_arrival_at`` (the span's start),
``engine_first_token_at`` (arrival + TTFT), ``finished_at`` (arrival + E2E) and
``first_scheduled_at`` (first token − prefill time: the engine core's own interval
placed before the frontend's first-token instant, so within the engine-to-frontend
delay of a millisecond or so). The span carries no preemption count: the preempt
columns stay absent, and the report shows "–" for them.
"""

from __future__ import annotations

import polars as pl

from harness.records.polars_types import PolarsType
from harness.records.spans import ATTR_PREFIX

SPAN_NAME = "llm_request"
#: requests.parquet column <- vLLM span attribute (without ``attr.``).
VLLM_ATTRIBUTES = {
    "queue_s": "gen_ai.latency.time_in_queue",
    "engine_ttft_s": "gen_ai.latency.time_to_first_token",
    "engine_e2e_s": "gen_ai.latency.e2e",
    "engine_prompt_tokens": "gen_ai.usage.prompt_tokens",
    "engine_output_tokens": "gen_ai.usage.completion_tokens",
}
PREFILL_ATTRIBUTE = "gen_ai.latency.time_in_model_prefill"
#: What the cell's run.json ``server_columns_source`` and the report say.
SOURCE = "vLLM's llm_request spans (gen_ai.latency.*, gen_ai.usage.*)"
INTEGER_COLUMNS = ("engine_prompt_tokens", "engine_output_tokens")


def span_columns(spans: pl.DataFrame) -> pl.DataFrame | None:
    """One row per request id with the columns vLLM's ``llm_request`` spans give
    (``VLLM_ATTRIBUTES`` and the instants of the module docstring); None when the
    spans hold no such span with a request id and a queue time. A request with
    several spans (a client's retry of the same id) keeps the one that ended last."""
    queue = ATTR_PREFIX + VLLM_ATTRIBUTES["queue_s"]
    if queue not in spans.columns or "request_id" not in spans.columns:
        return None
    ours = spans.filter(
        (pl.col("name") == SPAN_NAME)
        & pl.col("request_id").is_not_null()
        & pl.col(queue).is_not_null()
    )
    if ours.height == 0:
        return None

    def attr(name: str, dtype: PolarsType = pl.Float64) -> pl.Expr:
        column = ATTR_PREFIX + name
        if column not in ours.columns:
            return pl.lit(None, dtype=dtype)
        return pl.col(column).cast(dtype, strict=False)

    values = [
        attr(source, pl.Int64 if column in INTEGER_COLUMNS else pl.Float64).alias(column)
        for column, source in VLLM_ATTRIBUTES.items()
    ]
    frame = (
        ours.sort("end")
        .unique("request_id", keep="last", maintain_order=True)
        .select(
            "request_id",
            *values,
            pl.col("start").alias("engine_arrival_at"),
            attr(PREFILL_ATTRIBUTE).alias("_prefill_s"),
        )
    )
    first_token = pl.col("engine_arrival_at") + pl.col("engine_ttft_s")
    return frame.with_columns(
        engine_first_token_at=first_token,
        first_scheduled_at=first_token - pl.col("_prefill_s"),
        finished_at=pl.col("engine_arrival_at") + pl.col("engine_e2e_s"),
    ).drop("_prefill_s")


def join_span_columns(requests: pl.DataFrame, spans: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """(``requests`` with :func:`span_columns` left-joined by request id, the number of
    rows that found their span). Columns already in ``requests`` are kept as they are."""
    columns = span_columns(spans)
    if columns is None:
        return requests, 0
    matched = int(requests["request_id"].is_in(columns["request_id"].implode()).sum())
    columns = columns.select(
        "request_id", *[c for c in columns.columns if c not in requests.columns]
    )
    joined = requests.join(columns, on="request_id", how="left", maintain_order="left")
    return joined, matched
