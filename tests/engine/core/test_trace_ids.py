"""Spans and exemplars agree on a request's trace id without sharing state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.request import EngineRequest, parse_traceparent
from engine.core.sequence import Sequence
from engine.telemetry.trace_ids import (
    derived_trace_id,
    format_trace_id,
    request_trace_id,
    traceparent_ids,
)


def test_a_client_traceparent_gives_the_request_its_trace_id():
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    seq = Sequence(
        EngineRequest("r1", [5, 6], arrival_time=1.0, traceparent=parse_traceparent(header)),
        seq_no=0,
    )
    assert format_trace_id(request_trace_id(seq)) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert traceparent_ids(header) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7)


@settings(deadline=None)  # a loaded CI machine can stall any example past 200 ms
@given(
    request_id=st.text(max_size=40),
    seq_no=st.integers(0, 2**40),
    arrival=st.floats(0, 1e9, allow_nan=False),
)
def test_a_derived_trace_id_is_a_function_of_the_request_and_valid(request_id, seq_no, arrival):
    seq = Sequence(EngineRequest(request_id or "x", [5], arrival_time=arrival), seq_no=seq_no)
    first = request_trace_id(seq)
    assert first == request_trace_id(seq) == derived_trace_id(seq.request_id, seq_no, arrival)
    assert 0 < first < 2**128 and len(format_trace_id(first)) == 32
    # A reused request id in the same engine is another request: another trace.
    assert derived_trace_id(seq.request_id, seq_no + 1, arrival) != first
