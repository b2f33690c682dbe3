"""The step record: everything one engine step did, in one self-contained object.

Observers (``engine.records.observers``) — the token-timing bookkeeping, the simulator's
records, the server's streams and stats, telemetry — read a :class:`StepRecord` and
nothing else of the scheduler. A record is built after the step's results were
applied, so its snapshots (per-sequence token counts, queue depths, pool usage) are
taken when they were true and do not change afterwards.

Times are on the engine clock (``engine.core.clock``): seconds since the engine's epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.block_manager import BlockMapping
from engine.core.decisions import Decision
from engine.core.sequence import Sequence

PREFILL = "prefill"  # a chunk (or the whole) of the prompt, first time
RECOMPUTE = "recompute"  # re-prefilling tokens whose KV a recompute preemption dropped
DECODE = "decode"  # one generated token


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence in the step. ``seq`` is the live request state (read its
    identity and final state from it; the counts here are this step's)."""

    seq: Sequence
    request_id: str
    kind: str  # PREFILL | RECOMPUTE | DECODE
    num_scheduled_tokens: int
    num_computed_before: int  # tokens with KV before this step
    token_id: int | None  # the token sampled at the end of the step (None: a partial chunk)


@dataclass(slots=True)
class StepRecord:
    step: int
    schedule_start: float
    execute_start: float
    execute_end: float
    #: When the step's results were applied; every token of the step was received then.
    token_time: float
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_recompute_tokens: int = 0  # of num_prefill_tokens, those re-prefilled
    num_decode_seqs: int = 0
    # the cost model's other features (engine.core.cost_model.step_features)
    num_decode_context_tokens: int = 0  # sum of the decoding sequences' context lengths
    prefill_attention_work: int = 0  # sum over prefill chunks of chunk_len * context_len
    #: prefill chunks x longest chunk x longest context (the runner pads to them)
    prefill_padded_attention_work: int = 0
    num_idle_running: int = 0  # running sequences left out of this step
    # queue depths after scheduling (what the step ran with)
    num_waiting: int = 0
    num_running: int = 0
    num_swapped: int = 0
    #: Prefix caching: prompt tokens this step's admissions found cached (not computed;
    #: their ``admit``/``recompute`` decisions say whose), and cached blocks evicted.
    num_cached_tokens: int = 0
    num_evicted_blocks: int = 0
    # KV pools after scheduling
    num_free_device_blocks: int = 0
    num_device_blocks: int = 0
    num_free_host_blocks: int = 0
    num_host_blocks: int = 0
    #: (device, host) block pairs copied out, (host, device) pairs copied in.
    blocks_to_swap_out: BlockMapping = field(default_factory=list)
    blocks_to_swap_in: BlockMapping = field(default_factory=list)
    swap_out_s: float = 0.0  # measured copy time (predicted, in simulation)
    swap_in_s: float = 0.0
    #: Executor time split, where the executor measures it (0: not measured).
    forward_s: float = 0.0
    sample_s: float = 0.0
    #: Every decision of the step: those taken while scheduling, those taken between
    #: the previous step and this one (rejections, aborts), and ``fail`` decisions.
    decisions: list[Decision] = field(default_factory=list)
    #: Requests that ended with this record: finished by the step, failed by it, or
    #: ended between steps (rejected, aborted). Each request ends in exactly one record.
    finished: list[Sequence] = field(default_factory=list)
    error: str | None = None  # the step failed; its requests are in ``finished``
    #: When nothing was scheduled but something becomes schedulable at a known time
    #: without an arrival (static batching's timeout), that time.
    wake_at: float | None = None
    #: How long the driver (the served step loop, the simulator) waited with nothing to
    #: do between the previous step and this one. A step's full cycle — schedule,
    #: execute, observers, hand-off, commands — is then
    #: ``next.schedule_start - schedule_start - next.idle_before_s``.
    idle_before_s: float = 0.0

    @property
    def num_blocks_swapped_out(self) -> int:
        return len(self.blocks_to_swap_out)

    @property
    def num_blocks_swapped_in(self) -> int:
        return len(self.blocks_to_swap_in)

    @property
    def is_empty(self) -> bool:
        """Nothing was computed or copied."""
        return not self.scheduled and not self.blocks_to_swap_out and not self.blocks_to_swap_in

    @property
    def num_prefill_seqs(self) -> int:
        return len(self.scheduled) - self.num_decode_seqs

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def duration_s(self) -> float:
        """From the start of scheduling to the results being applied."""
        return self.token_time - self.schedule_start

    def emitted(self) -> list[ScheduledSeq]:
        """The sequences that received a token in this step (at ``token_time``)."""
        return [entry for entry in self.scheduled if entry.token_id is not None]
