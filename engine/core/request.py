"""The request as it enters the engine: everything known about it on arrival.

An :class:`EngineRequest` is built once — by the server when it has parsed an HTTP
request, by the simulator when the virtual clock reaches a scheduled arrival, by a
test or benchmark directly — and passed unchanged through ``AsyncEngine``,
``LLMEngine`` and ``Scheduler.add``. The scheduler turns it into a
:class:`engine.core.sequence.Sequence`, which holds the request's changing state.

``arrival_time`` is on the engine's clock (seconds since its epoch; see
``engine.core.clock``). It is stamped where the request arrives, not where the step loop
picks it up: a request that arrives while a step runs waits for that step, and that
wait is part of its ``queue_s``. ``None`` means "now", read by the engine when it
adds the request (offline use, where the two are the same).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams

#: W3C Trace Context ``traceparent``: version-traceid-parentid-flags, lowercase hex.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def parse_traceparent(value: str | None) -> str | None:
    """The header value when it is a valid W3C ``traceparent``, else None.

    As the W3C spec asks, an invalid header is ignored (the request starts a new
    trace) rather than refused: tracing must never fail a request. All-zero trace
    or parent ids and version ``ff`` are invalid.
    """
    if value is None:
        return None
    value = value.strip()
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, parent_id, _ = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return value


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One request, as the engine receives it. Immutable: the engine never edits it."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    #: Engine-clock seconds when the request arrived (None: when the engine adds it).
    arrival_time: float | None = None
    #: vLLM's meaning: lower is served earlier under the priority policy.
    priority: int = 0
    #: The client's label for the request's kind (``X-Request-Class``), carried into
    #: every record of the request so reports can compare classes.
    request_class: str = ""
    #: The client's W3C ``traceparent``, so the engine's spans join the client's trace.
    traceparent: str | None = None
    #: The true output length when it is known in advance (simulation): the simulated
    #: executor emits EOS there, and SJF's ``oracle`` estimator reads it.
    oracle_output_tokens: int | None = None
    #: Which turn of a conversation the request is (1: its first), 0 when unknown: the
    #: client's ``X-Session-Turn``, else a chat request's count of user messages.
    session_turn: int = 0

    def stamped(self, arrival_time: float) -> EngineRequest:
        """This request with its arrival time set (when it had none)."""
        if self.arrival_time is not None:
            return self
        return EngineRequest(
            self.request_id,
            self.prompt_token_ids,
            self.params,
            arrival_time,
            self.priority,
            self.request_class,
            self.traceparent,
            self.oracle_output_tokens,
            self.session_turn,
        )
