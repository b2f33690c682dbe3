"""What the streaming client does with values a target should never send (in process).

The target is tests/support/hostile_target.py: each request's id names the behaviour
it gets. Every bad value makes that request's row an ``error`` naming the field, the
row keeps the types of its columns (so the merge reads it), and no count a target
claims grows the row beyond the ``max_tokens`` asked.
"""

from __future__ import annotations

import math
import time

import polars as pl
import pytest

from harness.loadgen.client import FastTransport, OpenAIClient, RequestsTransport, retry_after_s
from harness.loadgen.merge import merge_records
from harness.loadgen.records import RecordWriter
from harness.loadgen.target_values import MAX_ERROR_CHARS, clean_text, token_count
from harness.profiles.schedule import RequestSpec
from tests.support.hostile_target import MARKUP, MODEL, MODES, OK_MODES, HostileTarget

MAX_TOKENS = 6
#: the modes a request ends by itself (the endless ones are tested on their own below)
FINITE = [m for m in MODES if m not in ("endless_line", "ping_flood", "endless_ping")]


def spec(request_id: str, output_tokens: int = MAX_TOKENS) -> RequestSpec:
    return RequestSpec(request_id, 0, 0, "c", 8, output_tokens, 64, 0, 0.0)


def client_of(url: str, transport=FastTransport) -> OpenAIClient:
    return OpenAIClient(
        transport(url, 4, 10.0),
        endpoint="completions",
        model=MODEL,
        id_range=(300, 1200),
        continuous_usage=True,
    )


def send(client: OpenAIClient, request_id: str, output_tokens: int = MAX_TOKENS) -> dict:
    s = spec(request_id, output_tokens)
    row = client.new_row(s, "open", time.time(), False)
    client.send(row, s)
    return row


@pytest.fixture(scope="module")
def target():
    with HostileTarget() as t:
        yield t


@pytest.mark.parametrize("mode", FINITE)
def test_each_bad_value_is_an_error_row_naming_its_field(target, mode):
    row = send(client_of(target.url), f"{mode}:1")
    field = MODES[mode][1]
    if mode in OK_MODES:
        assert row["status"] == "ok", row["error"]
        assert row["output_tokens"] == MAX_TOKENS and type(row["output_tokens"]) is int
        assert row["server_prompt_tokens"] == 8 and type(row["server_prompt_tokens"]) is int
        assert len(row["itl_s"]) == MAX_TOKENS - 1
        return
    assert row["status"] == "error", row
    assert len(row["error"]) <= MAX_ERROR_CHARS
    assert row["error"].isprintable(), row["error"]
    if field is not None:
        assert field in row["error"], row["error"]
    # nothing a target claimed beyond what was asked is kept
    assert row["output_tokens"] is None or 0 <= row["output_tokens"] <= MAX_TOKENS
    assert len(row["itl_s"]) <= MAX_TOKENS - 1
    for key in ("server_prompt_tokens", "output_tokens"):
        assert row[key] is None or type(row[key]) is int


def test_text_chunks_past_max_tokens_end_the_request_without_more_tokens(target):
    # Counted by chunks, extra text (held-back stop-string text a server flushes at the
    # end) is not a claim of more tokens: the request is ok, its count and gaps within
    # max_tokens, its end the last chunk's.
    row = send(client_of(target.url), "extra_text_chunks:1")
    assert row["status"] == "ok", row["error"]
    assert len(row["itl_s"]) == MAX_TOKENS - 1
    assert sum(row["itl_s"]) == pytest.approx(row["last_token_at"] - row["first_token_at"])


def test_a_string_prompt_count_names_the_value(target):
    row = send(client_of(target.url), "prompt_tokens_string:1")
    assert row["error"] == 'target sent usage.prompt_tokens "lots": not a token count'


def test_a_huge_completion_count_is_refused_and_the_row_stays_small(target):
    """One chunk claiming 3,000,000 tokens had grown ``itl_s`` to 3,000,002 entries."""
    row = send(client_of(target.url), "completion_tokens_huge:1")
    assert row["status"] == "error"
    assert row["error"] == (
        f"target sent usage.completion_tokens 3000000: more than the {MAX_TOKENS} max_tokens asked"
    )
    assert row["itl_s"] == [] and row["output_tokens"] == 0


def test_error_messages_are_kept_literally_but_printable_and_bounded(target):
    client = client_of(target.url)
    event = send(client, "markup_error_event:1")
    assert event["status"] == "error" and event["error"].startswith(MARKUP)
    assert event["error"].isprintable()
    body = send(client, "markup_error_body:1")
    assert (body["status"], body["http_status"], body["error"]) == ("error", 500, MARKUP)
    long = send(client, "long_error_body:1")
    assert long["status"] == "error" and long["http_status"] == 500
    assert len(long["error"]) <= MAX_ERROR_CHARS and long["error"].isprintable()
    # the connection whose long body was left unread is not reused: the next is fine
    assert send(client, "good:2")["status"] == "ok"


@pytest.mark.parametrize("transport", [FastTransport, RequestsTransport])
def test_an_endless_line_ends_the_request_at_the_line_bound(target, transport):
    started = time.monotonic()
    row = send(client_of(target.url, transport), "endless_line:1")
    assert row["status"] == "error" and "longer than 1048576 bytes" in row["error"], row
    assert time.monotonic() - started < 30
    assert send(client_of(target.url, transport), "good:1")["status"] == "ok"


def test_a_flood_of_comments_ends_the_request_at_the_body_bound(target):
    row = send(client_of(target.url), "ping_flood:1", output_tokens=2)
    assert row["status"] == "error", row
    assert row["error"] == "target sent more than 1179648 bytes for 2 tokens"


def test_rows_of_every_bad_value_merge(target, tmp_path):
    """The rows of every mode, written as the load generator writes them, make one
    requests.parquet (a string count had failed the merge with Polars' ComputeError)."""
    client = client_of(target.url)
    writer = RecordWriter(tmp_path, 0)
    for i, mode in enumerate(FINITE):
        writer.write(send(client, f"{mode}:{i}"))
    writer.close()
    summary = merge_records(tmp_path)
    frame = pl.read_parquet(tmp_path / "requests.parquet")
    assert summary["rows"] == len(FINITE) == frame.height
    modes = frame["request_id"].str.split(":").list.first()
    by_mode = dict(zip(modes, frame["status"], strict=True))
    assert by_mode == {m: "ok" if m in OK_MODES else "error" for m in FINITE}
    assert frame["itl_s"].list.len().max() <= MAX_TOKENS - 1


def test_the_checks_of_a_count():
    assert token_count(3, "f") == 3 and token_count(3.0, "f") == 3
    for bad in (True, -1, 2.5, math.nan, math.inf, -math.inf, 1e300, "3", None, [3], {"n": 3}):
        with pytest.raises(ValueError, match="target sent f .*: not a token count"):
            token_count(bad, "f")
    assert token_count(10**18, "f") == 10**18  # a count; its bound is the caller's


def test_text_from_a_target_is_cut_and_printable():
    assert clean_text("a\x1b[31mb\nc\u202ed\ud800") == "a [31mb c d "
    assert len(clean_text("x" * 10_000)) == MAX_ERROR_CHARS
    assert clean_text(MARKUP) == MARKUP


def test_a_retry_after_that_is_no_duration_is_one_second():
    assert retry_after_s("2.5") == 2.5 and retry_after_s(None) == 1.0
    for bad in ("nan", "inf", "-3", "Wed, 21 Oct 2015 07:28:00 GMT"):
        assert retry_after_s(bad) == 1.0


def test_a_nan_count_never_reaches_the_row(target):
    """A NaN count is refused (json.dumps would write it as NaN; the merge's Int64
    column cannot hold it)."""
    row = send(client_of(target.url), "nan_count:1")
    assert row["status"] == "error" and row["server_prompt_tokens"] is None
    assert row["error"] == "target sent usage.prompt_tokens NaN: not a token count"
