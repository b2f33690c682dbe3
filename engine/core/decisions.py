"""Scheduler decisions as plain records.

The scheduler appends one :class:`Decision` per choice it makes; telemetry turns
them into spans and metrics in one place, reports read them back. Nothing here
imports OpenTelemetry or touches tensors. Records are created only when something
happens (an admission, a preemption, ...), never per sequence per step, so the
step's hot path stays free of them — except ``idle_running``, which is one record
per step listing every sequence the token budget left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Decision kinds ------------------------------------------------------------------
ADMIT = "admit"  # a waiting request entered the running set for the first time
PREEMPT = "preempt"  # a running request lost its place (mode: swap | recompute)
SWAP_OUT = "swap_out"  # its KV blocks moved device -> host
SWAP_IN = "swap_in"  # its KV blocks moved host -> device; it runs again
RECOMPUTE = "recompute"  # a recompute-preempted request re-entered to re-prefill
REJECT = "reject"  # a request that can never run, or arrived to a full queue
WAIT = "wait"  # the head of the queue could not be admitted (once per reason change)
IDLE_RUNNING = "idle_running"  # running requests left out of a step by the token budget
ABORT = "abort"  # the client went away or abort() was called
FAIL = "fail"  # the step failed, or this request's token could not be sampled (``detail``)

DECISION_KINDS = (
    ADMIT,
    PREEMPT,
    SWAP_OUT,
    SWAP_IN,
    RECOMPUTE,
    REJECT,
    WAIT,
    IDLE_RUNNING,
    ABORT,
    FAIL,
)

# Reasons -------------------------------------------------------------------------
REASON_POLICY_ORDER = "policy_order"  # admitted in the active policy's order
REASON_MAX_WAIT = "max_wait"  # waited past max_wait_s: served ahead of the policy
REASON_OUT_OF_BLOCKS = "out_of_blocks"  # the device KV pool had no room
REASON_PRIORITY = "priority"  # a waiting request with a better key needed the room
REASON_MAX_NUM_SEQS = "max_num_seqs"  # the running set was full
REASON_TOKEN_BUDGET = "token_budget"  # max_num_batched_tokens was used up
REASON_PREFILL_PRIORITY = "prefill_priority"  # no chunked prefill: new prefills ran alone
REASON_SWAP_SPACE_EXHAUSTED = "swap_space_exhausted"  # swap wanted, host pool full
REASON_SWAP_CHEAPER = "swap_cheaper"  # auto: swapping out and in costs less than recomputing
REASON_RECOMPUTE_CHEAPER = "recompute_cheaper"  # auto: re-prefilling costs less than swapping
REASON_EXCEEDS_MAX_MODEL_LEN = "exceeds_max_model_len"
REASON_EXCEEDS_KV_POOL = "exceeds_kv_pool"
REASON_QUEUE_FULL = "queue_full"  # max_waiting reached (a server answers 429)
# vLLM 0.32's admission caps (a server answers 503; vLLM's reason label values)
REASON_MAX_NUM_QUEUED_REQS = "max_num_queued_reqs"  # that many requests unfinished
REASON_MAX_NUM_QUEUED_TOKENS = "max_num_queued_tokens"  # that many prompt tokens pre-token
REASON_STATIC_BATCH = "static_batch"  # static batching: the batch is closed to joins
REASON_CLIENT = "client"  # abort requested from outside
REASON_EXECUTOR_ERROR = "executor_error"  # the step's execution raised
REASON_SAMPLING_ERROR = "sampling_error"  # this request's token could not be sampled
REASON_ENGINE_ERROR = "engine_error"  # the engine itself raised; every request failed


@dataclass(slots=True)
class Decision:
    """One scheduling choice.

    ``request_id`` is the request the decision is about (the victim of a
    preemption); ``beneficiary`` the one it was made for. ``mode`` is set on
    preemptions (``swap`` or ``recompute``). ``num_blocks`` counts blocks moved or
    needed, ``num_tokens`` tokens to (re-)prefill. ``request_ids`` lists the
    sequences of an ``idle_running`` record. ``num_cached_tokens``: on an ``admit`` or
    ``recompute``, the tokens of ``num_tokens`` found in the prefix cache (not computed);
    ``num_evicted_prefix_tokens``: the tokens just after those that the cache had held
    and evicted (they would have been hits: cache thrash). ``lpm_cached_tokens``: on an
    ``admit`` or ``recompute`` under the lpm policy, the cached prefix (tokens) that
    ranked the request when its admission pass ranked the waiting window
    (``engine.core.sched.prefix_order``); it may differ from ``num_cached_tokens`` when an
    admission earlier in that pass registered or evicted blocks of its prefix. None: not
    ranked by its prefix (another policy, prefix caching off, beyond the window, a
    max-wait admission).
    """

    kind: str
    time: float
    step: int
    request_id: str | None = None
    reason: str = ""
    mode: str | None = None
    beneficiary: str | None = None
    num_blocks: int = 0
    num_tokens: int = 0
    request_ids: tuple[str, ...] = field(default_factory=tuple)
    detail: str = ""  # e.g. why a swap preemption fell back to recompute
    predicted_swap_s: float | None = None
    predicted_recompute_s: float | None = None
    num_cached_tokens: int = 0
    num_evicted_prefix_tokens: int = 0
    lpm_cached_tokens: int | None = None

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "time": self.time,
            "step": self.step,
            "request_id": self.request_id,
            "reason": self.reason,
            "mode": self.mode,
            "beneficiary": self.beneficiary,
            "num_blocks": self.num_blocks,
            "num_tokens": self.num_tokens,
            "request_ids": list(self.request_ids),
            "detail": self.detail,
            "predicted_swap_s": self.predicted_swap_s,
            "predicted_recompute_s": self.predicted_recompute_s,
            "num_cached_tokens": self.num_cached_tokens,
            "num_evicted_prefix_tokens": self.num_evicted_prefix_tokens,
            "lpm_cached_tokens": self.lpm_cached_tokens,
        }
