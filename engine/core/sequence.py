"""The request object: the one place that holds a request's state.

The scheduler moves a :class:`Sequence` between its queues and appends the tokens
the executor sampled; the block manager fills its block table; the token-timing
observer (``engine.core.token_timing``) stamps its token times. Nothing else owns request
state, so a record of a request is always read from here.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from engine.core.token_timing import TokenTiming

if TYPE_CHECKING:
    from engine.core.request import EngineRequest


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"  # EOS or a stop token
    FINISHED_LENGTH = "finished_length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "finished_aborted"  # the client went away / abort() was called
    FINISHED_REJECTED = "finished_rejected"  # can never run (too long, never fits the pool)
    FINISHED_ERROR = "finished_error"  # the executor failed while running it

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def record_status(self) -> str:
        """The status records and spans give a request that ended this way (docs/records.md:
        ok | error | rejected | aborted); ``error`` for one that has not ended."""
        return _RECORD_STATUS.get(self, "error")


_FINISHED = frozenset(
    {
        SequenceStatus.FINISHED_STOPPED,
        SequenceStatus.FINISHED_LENGTH,
        SequenceStatus.FINISHED_ABORTED,
        SequenceStatus.FINISHED_REJECTED,
        SequenceStatus.FINISHED_ERROR,
    }
)
_RECORD_STATUS = {
    SequenceStatus.FINISHED_STOPPED: "ok",
    SequenceStatus.FINISHED_LENGTH: "ok",
    SequenceStatus.FINISHED_ABORTED: "aborted",
    SequenceStatus.FINISHED_REJECTED: "rejected",
    SequenceStatus.FINISHED_ERROR: "error",
}

#: The OpenAI ``finish_reason`` / vLLM ``finished_reason`` label for each end state.
FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_REJECTED: "rejected",
    SequenceStatus.FINISHED_ERROR: "error",
}


class Sequence:
    """All per-request state.

    Token accounting: ``num_tokens`` = prompt + generated. ``num_computed_tokens`` is
    how many of them have KV in the cache. A step schedules ``num_scheduled_tokens``
    more; when that reaches ``num_tokens`` the step samples one new token. After a
    recompute preemption ``num_computed_tokens`` drops to 0 and the whole prompt
    plus the output so far is prefilled again (those tokens are counted in
    ``num_recomputed_tokens``).
    """

    __slots__ = (
        "request",
        "request_id",
        "seq_no",
        "prompt_token_ids",
        "output_token_ids",
        "params",
        "priority",
        "arrival_time",
        "request_class",
        "oracle_output_tokens",
        "status",
        "num_prompt_tokens",
        "num_tokens",
        "num_computed_tokens",
        "num_scheduled_tokens",
        "block_table",
        "num_registered_blocks",
        "chain_serial",
        "chain_block",
        "chain_pin",
        "chain",
        "num_cached_tokens",
        "num_evicted_prefix_tokens",
        "policy_key",
        "queue_version",
        "waiting_since",
        "first_scheduled_time",
        "finished_time",
        "swapped_out_time",
        "total_swapped_s",
        "total_queue_s",
        "num_preemptions_swap",
        "num_preemptions_recompute",
        "num_recomputed_tokens",
        "num_pending_recompute_tokens",
        "num_idle_running_steps",
        "reject_reason",
        "error",
        "promoted",
        "timing",
        "generator",
    )

    def __init__(self, request: EngineRequest, seq_no: int) -> None:
        """``request`` must carry its arrival time (the engine stamps it)."""
        if request.arrival_time is None:
            raise ValueError(f"request {request.request_id!r} has no arrival time")
        self.request = request  # what arrived, unchanged (trace context included)
        self.request_id = request.request_id
        self.seq_no = seq_no  # arrival order inside this engine: the final tie-breaker
        self.prompt_token_ids = list(request.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = request.params
        self.priority = request.priority
        self.arrival_time: float = request.arrival_time
        self.request_class = request.request_class
        # The true output length where one is known in advance (simulation): the
        # simulated executor emits EOS here; the sjf "oracle" estimator reads it.
        self.oracle_output_tokens = request.oracle_output_tokens
        self.status = SequenceStatus.WAITING
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_scheduled_tokens = 0  # tokens scheduled in the step being built
        self.block_table: list[int] = []
        # Prefix caching (engine/core/prefix_cache.py): how many of the block table's
        # blocks are registered (or were hits), the content serial of the last of them
        # (0: none) and the block holding it, and the chain this request extends (None:
        # its next registration starts one). Opaque outside the prefix cache.
        self.num_registered_blocks = 0
        self.chain_serial = 0
        self.chain_block: int | None = None
        # the chain holding that content, pinned while the request may still hang its
        # next blocks off it (see PrefixCache.follow)
        self.chain_pin: object | None = None
        self.chain: object | None = None
        #: Prompt tokens found in the prefix cache at the first admission (vLLM's
        #: ``num_cached_tokens``; a recompute's hits are not counted here).
        self.num_cached_tokens = 0
        #: Prompt tokens just after those that the cache had held and evicted before the
        #: first admission (``BlockManager.evicted_prefix``: cache thrash).
        self.num_evicted_prefix_tokens = 0
        self.policy_key: float = 0.0  # set by the policy when the request arrives
        self.queue_version = 0  # invalidates stale queue entries (lazy deletion)
        self.waiting_since = self.arrival_time
        self.first_scheduled_time: float | None = None
        self.finished_time: float | None = None
        self.swapped_out_time: float | None = None
        self.total_swapped_s = 0.0
        self.total_queue_s = 0.0  # every interval spent WAITING, re-queues included
        self.num_preemptions_swap = 0
        self.num_preemptions_recompute = 0
        self.num_recomputed_tokens = 0
        self.num_pending_recompute_tokens = 0  # still to be re-prefilled after a recompute
        self.num_idle_running_steps = 0
        self.reject_reason: str | None = None
        self.error: str | None = None
        self.promoted = False  # waited past max_wait_s: served ahead of the policy order
        self.timing = TokenTiming()  # written by the token-timing observer only
        #: The sampler's per-request RNG when params.seed is set: a torch.Generator,
        #: opaque here (the core never imports torch).
        self.generator: object | None = None

    # -- derived counts ------------------------------------------------------------
    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Whether this sequence's remaining work is a decode: one generated token left
        to compute. A prompt (or a recompute) of any length, even one token, is prefill
        work. The one definition the scheduler, the step's counts and the step record
        share."""
        computed = self.num_computed_tokens
        return self.num_tokens - computed == 1 and computed >= self.num_prompt_tokens

    @property
    def num_preemptions(self) -> int:
        return self.num_preemptions_swap + self.num_preemptions_recompute

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this request can ever hold: prompt + max_tokens."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def queue_s(self) -> float | None:
        """First admission minus arrival (docs/metrics.md ``queue_s``)."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def first_token_time(self) -> float | None:
        return self.timing.first_token_time

    @property
    def last_token_time(self) -> float | None:
        return self.timing.last_token_time

    @property
    def traceparent(self) -> str | None:
        return self.request.traceparent

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
