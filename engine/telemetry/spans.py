"""Step records as OpenTelemetry spans: one trace per request, one per window of steps.

:class:`SpanObserver` is a step-record observer. On the hot path it only appends a
request's decisions and prefill chunks to that request's history (a list); when the
request finishes it emits the request's spans in one go, with explicit timestamps
(engine time + the clock's epoch, in ns), so a served engine (wall clock) and the
simulator (virtual clock) share this code. Every step that computed something or
carried decisions becomes one ``engine.step`` span.

Span names and attributes are documented in docs/telemetry.md; the names here are
that document's. The counting rule a test relies on: every decision of kind admit,
preempt, swap_out, swap_in, recompute, reject, abort and fail is exactly one span
carrying ``schedscope.decision`` (its kind), in its request's trace, child of the
request's ``llm_request`` span; every ``wait`` and ``idle_running`` decision is
exactly one event (named after its kind) on its step's ``engine.step`` span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import Event
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from engine.core import decisions as d
from engine.core.sequence import Sequence
from engine.records.step_record import DECODE, RECOMPUTE, StepRecord
from engine.telemetry.trace_ids import request_trace_id

# Span names ------------------------------------------------------------------------
LLM_REQUEST = "llm_request"
SCHEDULE = "schedule"  # the admit decision: arrival -> admission
PREFILL_SPAN = "prefill"  # one per prefill (or re-prefill) chunk
DECODE_SPAN = "decode"  # one per run of decode steps between (re)starts and preemptions
PREEMPT_SPAN = "preempt"
SWAP_OUT_SPAN = "swap_out"
SWAP_IN_SPAN = "swap_in"
RECOMPUTE_SPAN = "recompute"
REJECT_SPAN = "reject"
ABORT_SPAN = "abort"
FAIL_SPAN = "fail"
ENGINE_STEP = "engine.step"
ENGINE_STEPS = "engine.steps"  # the root of a window of steps (one trace)

#: The span each decision kind becomes (wait and idle_running are step events).
DECISION_SPAN_NAMES = {
    d.ADMIT: SCHEDULE,
    d.PREEMPT: PREEMPT_SPAN,
    d.SWAP_OUT: SWAP_OUT_SPAN,
    d.SWAP_IN: SWAP_IN_SPAN,
    d.RECOMPUTE: RECOMPUTE_SPAN,
    d.REJECT: REJECT_SPAN,
    d.ABORT: ABORT_SPAN,
    d.FAIL: FAIL_SPAN,
}
STEP_EVENT_KINDS = (d.WAIT, d.IDLE_RUNNING)

# Attribute names (GenAI semantic conventions, "Development" status, spelled here) --
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
#: The engine does not know whether a request came through /v1/completions or
#: /v1/chat/completions; every request is named a text completion.
OPERATION_TEXT_COMPLETION = "text_completion"

REQUEST_ID = "schedscope.request.id"
DECISION = "schedscope.decision"
STEP = "schedscope.step"
#: On an admission's (and a recompute's) span: prompt tokens found in the prefix cache.
CACHED_TOKENS = "schedscope.prefix_cache.cached_tokens"
#: ... and the tokens after those that the cache had held and evicted (cache thrash).
EVICTED_PREFIX_TOKENS = "schedscope.prefix_cache.evicted_prefix_tokens"
#: Under the lpm policy: the cached prefix (tokens) that ranked the admission (absent when
#: its prefix did not rank it: beyond the window, a max-wait admission, caching off).
LPM_CACHED_TOKENS = "schedscope.lpm.cached_tokens"


_PREFILL_EVENT = "p"
_DECISION_EVENT = "d"


class SpanObserver:
    """Turns step records into spans emitted through ``spans``
    (``tracing.FinishedSpans``).

    A request's root span has the request's trace id (``request_trace_id``: the
    client's, or one derived from the request, as Prometheus exemplars have it). A
    request whose client ``traceparent`` has the sampled flag off gets no spans.
    ``epoch_unix`` maps engine time to Unix time; ``bytes_per_block`` prices swapped
    blocks in bytes (0: not known)."""

    def __init__(
        self,
        spans,
        epoch_unix: float,
        policy: str = "",
        model_name: str = "",
        bytes_per_block: int = 0,
        steps_per_trace: int = 100,
        max_window_s: float = 10.0,
    ) -> None:
        self.spans = spans
        self.epoch_ns = round(epoch_unix * 1e9)
        self.policy = policy
        self.model_name = model_name
        self.bytes_per_block = bytes_per_block
        self.steps_per_trace = max(1, steps_per_trace)
        self.max_window_s = max_window_s
        self._histories: dict[str, list[tuple]] = {}
        #: The open engine.steps window: [context, first step, last step, num steps,
        #: start (engine time), end (engine time)].
        self._window: list[Any] | None = None
        self.num_request_spans = 0
        #: Requests whose client ``traceparent`` had the sampled flag off: no spans.
        self.num_unsampled_requests = 0
        self.num_decision_spans = 0
        self.num_step_spans = 0

    def ns(self, t: float) -> int:
        return self.epoch_ns + round(t * 1e9)

    # -- the hot path ----------------------------------------------------------------
    def __call__(self, record: StepRecord) -> None:
        histories = self._histories
        if record.decisions:
            for dec in record.decisions:
                kind = dec.kind
                if kind in STEP_EVENT_KINDS or dec.request_id is None:
                    continue
                history = histories.get(dec.request_id)
                if history is None:
                    history = histories[dec.request_id] = []
                history.append((_DECISION_EVENT, dec, record))
        if record.num_prefill_tokens:
            for entry in record.scheduled:
                if entry.kind is not DECODE:
                    history = histories.get(entry.request_id)
                    if history is None:
                        history = histories[entry.request_id] = []
                    history.append(
                        (
                            _PREFILL_EVENT,
                            entry.kind,
                            record.execute_start,
                            record.token_time,
                            entry.num_scheduled_tokens,
                            entry.num_computed_before,
                            record.step,
                            entry.token_id is not None,
                        )
                    )
        if not record.is_empty or record.decisions:
            self._step_span(record)
        for seq in record.finished:
            self._request_spans(seq, histories.pop(seq.request_id, ()), record)

    # -- engine.step ---------------------------------------------------------------
    def _step_span(self, record: StepRecord) -> None:
        window = self._window
        if window is not None and (
            window[3] >= self.steps_per_trace
            or record.schedule_start - window[4] > self.max_window_s
        ):
            self._close_window()
            window = None
        spans = self.spans
        if window is None:
            window = self._window = [
                spans.context(spans.new_trace_id()),
                record.step,
                record.step,
                0,
                record.schedule_start,
                record.token_time,
            ]
        window[2] = record.step
        window[3] += 1
        window[5] = record.token_time
        num_device = record.num_device_blocks
        # What steps.parquet does not make obvious from the span itself (its duration
        # is the step's time); kept short: this span is made every step.
        attributes = {
            STEP: record.step,
            "schedscope.step.num_seqs": len(record.scheduled),
            "schedscope.step.num_prefill_tokens": record.num_prefill_tokens,
            "schedscope.step.num_recompute_tokens": record.num_recompute_tokens,
            "schedscope.step.num_decode_seqs": record.num_decode_seqs,
            "schedscope.step.num_idle_running": record.num_idle_running,
            "schedscope.step.num_decisions": len(record.decisions),
            "schedscope.queue.num_waiting": record.num_waiting,
            "schedscope.queue.num_running": record.num_running,
            "schedscope.queue.num_swapped": record.num_swapped,
            "schedscope.kv.device_usage": (
                1.0 - record.num_free_device_blocks / num_device if num_device else 0.0
            ),
        }
        if record.num_swapped or record.blocks_to_swap_out:
            num_host = record.num_host_blocks
            attributes["schedscope.kv.host_usage"] = (
                1.0 - record.num_free_host_blocks / num_host if num_host else 0.0
            )
        if record.blocks_to_swap_out or record.blocks_to_swap_in:
            attributes["schedscope.step.num_blocks_swapped_out"] = len(record.blocks_to_swap_out)
            attributes["schedscope.step.num_blocks_swapped_in"] = len(record.blocks_to_swap_in)
            attributes["schedscope.step.swap_out_s"] = record.swap_out_s
            attributes["schedscope.step.swap_in_s"] = record.swap_in_s
        if record.forward_s:
            attributes["schedscope.step.forward_s"] = record.forward_s
            attributes["schedscope.step.sample_s"] = record.sample_s
        events = []
        for dec in record.decisions:
            if dec.kind in STEP_EVENT_KINDS:
                event: dict[str, AttributeValue] = {
                    DECISION: dec.kind,
                    "schedscope.reason": dec.reason,
                }
                if dec.request_id is not None:
                    event[REQUEST_ID] = dec.request_id
                if dec.request_ids:
                    event["schedscope.request_ids"] = list(dec.request_ids)
                if dec.num_blocks:
                    event["schedscope.num_blocks"] = dec.num_blocks
                if dec.num_tokens:
                    event["schedscope.num_tokens"] = dec.num_tokens
                if dec.num_cached_tokens:
                    event[CACHED_TOKENS] = dec.num_cached_tokens
                events.append(Event(dec.kind, event, self.ns(dec.time)))
        parent = window[0]
        spans.emit(
            ENGINE_STEP,
            spans.context(parent.trace_id),
            parent,
            SpanKind.INTERNAL,
            self.ns(record.schedule_start),
            self.ns(record.token_time),
            attributes,
            events,
            Status(StatusCode.ERROR, record.error) if record.error else None,
        )
        self.num_step_spans += 1

    def _close_window(self) -> None:
        window, self._window = self._window, None
        if window is None:
            return
        context, first, last, num_steps, start, end = window
        self.spans.emit(
            ENGINE_STEPS,
            context,
            None,
            SpanKind.INTERNAL,
            self.ns(start),
            self.ns(end),
            {
                "schedscope.steps.first": first,
                "schedscope.steps.last": last,
                "schedscope.steps.num_steps": num_steps,
            },
        )

    def close(self) -> None:
        """End the open window of steps (at shutdown)."""
        self._close_window()

    # -- a request's trace -----------------------------------------------------------
    def _request_spans(self, seq: Sequence, history, record: StepRecord) -> None:
        start = seq.arrival_time
        end = seq.finished_time if seq.finished_time is not None else record.token_time
        end = max(end, start)
        spans = self.spans
        parent = _client_parent(seq.traceparent)
        if parent is not None and not parent.trace_flags.sampled:
            # W3C Trace Context: the caller did not sample this trace, so neither do we
            # (as the SDK's default parent-based sampler would): no spans in it.
            self.num_unsampled_requests += 1
            return
        trace_id = request_trace_id(seq)  # the client's trace id when it sent one
        root = spans.context(trace_id)
        status = seq.status.record_status
        for name, t0, t1, attributes in self._children(seq, history, start, end):
            t0 = min(max(t0, start), end)
            t1 = min(max(t1, t0), end)
            failed = name in (REJECT_SPAN, ABORT_SPAN, FAIL_SPAN)
            spans.emit(
                name,
                spans.context(trace_id),
                root,
                SpanKind.INTERNAL,
                self.ns(t0),
                self.ns(t1),
                attributes,
                status=Status(StatusCode.ERROR, attributes.get("schedscope.reason", ""))
                if failed
                else None,
            )
        spans.emit(
            LLM_REQUEST,
            root,
            parent,
            SpanKind.SERVER,
            self.ns(start),
            self.ns(end),
            self._request_attributes(seq, status),
            status=Status(StatusCode.ERROR, _error_text(seq, status)) if status != "ok" else None,
        )
        self.num_request_spans += 1

    def _request_attributes(self, seq: Sequence, status: str) -> dict:
        params = seq.params
        timing = seq.timing
        arrival = seq.arrival_time
        attributes = {
            GEN_AI_OPERATION_NAME: OPERATION_TEXT_COMPLETION,
            GEN_AI_REQUEST_MODEL: self.model_name,
            GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens,
            GEN_AI_REQUEST_TEMPERATURE: float(params.temperature),
            GEN_AI_REQUEST_TOP_P: float(params.top_p),
            GEN_AI_RESPONSE_ID: seq.request_id,
            GEN_AI_USAGE_INPUT_TOKENS: seq.num_prompt_tokens,
            GEN_AI_USAGE_OUTPUT_TOKENS: seq.num_output_tokens,
            GEN_AI_RESPONSE_FINISH_REASONS: [seq.finish_reason or "error"],
            REQUEST_ID: seq.request_id,
            "schedscope.request.seq_no": seq.seq_no,
            "schedscope.request.priority": seq.priority,
            "schedscope.request.status": status,
            "schedscope.policy": self.policy,
            "schedscope.total_queue_s": seq.total_queue_s,
            "schedscope.preemptions": seq.num_preemptions,
            "schedscope.preempt_swaps": seq.num_preemptions_swap,
            "schedscope.preempt_recomputes": seq.num_preemptions_recompute,
            "schedscope.swapped_s": seq.total_swapped_s,
            "schedscope.recomputed_tokens": seq.num_recomputed_tokens,
            CACHED_TOKENS: seq.num_cached_tokens,
            EVICTED_PREFIX_TOKENS: seq.num_evicted_prefix_tokens,
            "schedscope.idle_running_steps": seq.num_idle_running_steps,
            "schedscope.max_itl_s": timing.max_itl_s,
            "schedscope.stall_s": sum(gap for _, gap in timing.long_gaps),
            "schedscope.num_stalls": len(timing.long_gaps),
        }
        if params.top_k > 0:
            attributes[GEN_AI_REQUEST_TOP_K] = params.top_k
        if params.seed is not None:
            attributes[GEN_AI_REQUEST_SEED] = params.seed
        if seq.request_class:
            attributes["schedscope.request.class"] = seq.request_class
        if seq.queue_s is not None:
            attributes["schedscope.queue_s"] = seq.queue_s
        if timing.first_token_time is not None:
            attributes["schedscope.ttft_s"] = timing.first_token_time - arrival
        if timing.last_token_time is not None:
            attributes["schedscope.e2e_s"] = timing.last_token_time - arrival
        if seq.reject_reason:
            attributes["schedscope.reject_reason"] = seq.reject_reason
        if seq.error:
            attributes["schedscope.error"] = seq.error
        return attributes

    def _children(self, seq: Sequence, history, start: float, end: float):
        """(name, start, end, attributes) of a request's child spans, in time order."""
        out = []
        decode_start = None  # the open decode run began here
        prefilled = False  # the prompt is done: the request decodes when it runs
        preempt = None  # the open preemption: (decision, attributes)
        recompute = None  # the open re-prefill: [start, end, attributes]
        last_token = seq.timing.last_token_time

        def close_decode(at: float) -> None:
            nonlocal decode_start
            if decode_start is not None and at > decode_start:
                out.append((DECODE_SPAN, decode_start, at, {REQUEST_ID: seq.request_id}))
            decode_start = None

        def close_recompute(at: float | None = None) -> None:
            nonlocal recompute
            if recompute is not None:
                t1 = recompute[1] if at is None else max(recompute[1], at)
                out.append((RECOMPUTE_SPAN, recompute[0], t1, recompute[2]))
            recompute = None

        def close_preempt(at: float, resumed: bool) -> None:
            nonlocal preempt
            if preempt is not None:
                dec, attributes = preempt
                attributes["schedscope.preempt.resumed"] = resumed
                out.append((PREEMPT_SPAN, dec.time, at, attributes))
            preempt = None

        for event in history:
            if event[0] == _PREFILL_EVENT:
                _, kind, t0, t1, num_tokens, computed_before, step, sampled = event
                out.append(
                    (
                        PREFILL_SPAN,
                        t0,
                        t1,
                        {
                            REQUEST_ID: seq.request_id,
                            STEP: step,
                            "schedscope.prefill.kind": kind,
                            "schedscope.prefill.num_tokens": num_tokens,
                            "schedscope.prefill.num_computed_before": computed_before,
                        },
                    )
                )
                if kind == RECOMPUTE and recompute is not None:
                    recompute[1] = t1
                if sampled:
                    prefilled = True
                    if recompute is not None:
                        close_recompute()
                    if decode_start is None:
                        decode_start = t1
                continue
            _, dec, record = event
            kind = dec.kind
            attributes = {
                REQUEST_ID: seq.request_id,
                DECISION: kind,
                STEP: dec.step,
                "schedscope.reason": dec.reason,
            }
            if dec.detail:
                attributes["schedscope.detail"] = dec.detail
            if kind == d.ADMIT:
                attributes["schedscope.num_blocks"] = dec.num_blocks
                attributes["schedscope.queue_s"] = dec.time - start
                attributes[CACHED_TOKENS] = dec.num_cached_tokens
                attributes[EVICTED_PREFIX_TOKENS] = dec.num_evicted_prefix_tokens
                if dec.lpm_cached_tokens is not None:
                    attributes[LPM_CACHED_TOKENS] = dec.lpm_cached_tokens
                out.append((SCHEDULE, start, dec.time, attributes))
            elif kind == d.PREEMPT:
                close_decode(dec.time)
                close_recompute(dec.time)
                attributes["schedscope.preempt.mode"] = dec.mode or ""
                attributes["schedscope.preempt.victim"] = dec.request_id
                if dec.beneficiary is not None:
                    attributes["schedscope.preempt.beneficiary"] = dec.beneficiary
                attributes["schedscope.num_blocks"] = dec.num_blocks
                attributes["schedscope.preempt.num_tokens_discarded"] = dec.num_tokens
                if dec.predicted_swap_s is not None:
                    attributes["schedscope.preempt.predicted_swap_s"] = dec.predicted_swap_s
                if dec.predicted_recompute_s is not None:
                    attributes["schedscope.preempt.predicted_recompute_s"] = (
                        dec.predicted_recompute_s
                    )
                close_preempt(dec.time, True)  # preempted again without running: close it
                preempt = (dec, attributes)
            elif kind in (d.SWAP_OUT, d.SWAP_IN):
                out_bound = kind == d.SWAP_OUT
                mapping = record.blocks_to_swap_out if out_bound else record.blocks_to_swap_in
                step_copy_s = record.swap_out_s if out_bound else record.swap_in_s
                share = step_copy_s * dec.num_blocks / len(mapping) if mapping else 0.0
                attributes["schedscope.num_blocks"] = dec.num_blocks
                attributes["schedscope.swap.copy_s"] = share
                attributes["schedscope.swap.step_copy_s"] = step_copy_s
                attributes["schedscope.swap.step_num_blocks"] = len(mapping)
                if self.bytes_per_block:
                    attributes["schedscope.swap.bytes"] = dec.num_blocks * self.bytes_per_block
                t0 = max(record.execute_start, dec.time)
                if not out_bound:
                    close_preempt(dec.time, True)
                out.append(
                    (SWAP_OUT_SPAN if out_bound else SWAP_IN_SPAN, t0, t0 + share, attributes)
                )
                if not out_bound and prefilled:
                    decode_start = t0 + share
            elif kind == d.RECOMPUTE:
                close_preempt(dec.time, True)
                attributes["schedscope.recompute.num_tokens"] = dec.num_tokens
                attributes["schedscope.num_blocks"] = dec.num_blocks
                attributes[CACHED_TOKENS] = dec.num_cached_tokens
                if dec.lpm_cached_tokens is not None:
                    attributes[LPM_CACHED_TOKENS] = dec.lpm_cached_tokens
                recompute = [dec.time, dec.time, attributes]
            else:  # reject, abort, fail: the request ends here
                close_decode(dec.time)
                close_recompute(dec.time)
                if kind == d.REJECT:
                    attributes["schedscope.num_blocks"] = dec.num_blocks
                    attributes["schedscope.num_tokens"] = dec.num_tokens
                out.append(
                    (
                        DECISION_SPAN_NAMES[kind],
                        dec.time if kind != d.REJECT else start,
                        dec.time,
                        attributes,
                    )
                )
        if last_token is not None:
            close_decode(last_token)
        decode_start = None
        close_recompute()
        close_preempt(end, False)
        out.sort(key=lambda child: child[1])
        self.num_decision_spans += sum(1 for child in out if DECISION in child[3])
        return out


def _client_parent(traceparent: str | None) -> SpanContext | None:
    """The remote parent span a client's W3C traceparent names (None without one)."""
    if not traceparent:
        return None
    _, trace_id, span_id, flags = traceparent.split("-")
    return SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
    )


def _error_text(seq: Sequence, status: str) -> str:
    if status == "rejected":
        return f"rejected: {seq.reject_reason or 'unknown'}"
    if status == "aborted":
        return "aborted"
    return seq.error or "error"
