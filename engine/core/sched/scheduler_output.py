"""What the scheduler hands the executor for one step."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.block_manager import BlockMapping
from engine.core.decisions import Decision
from engine.core.prefill_groups import padded_prefill_work
from engine.core.sequence import Sequence


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work. Each scheduled sequence carries ``num_scheduled_tokens``.

    A scheduled sequence samples a token at the end of the step exactly when
    ``num_computed_tokens + num_scheduled_tokens == num_tokens``. Queue depths are
    those after scheduling (what the step runs with).
    """

    step: int
    time: float
    seqs: list[Sequence] = field(default_factory=list)
    #: Aligned with ``seqs``: whether that sequence's work in this step is a decode
    #: (``Sequence.is_decoding`` when it was scheduled). Classified once, here; the
    #: step record reads it.
    is_decode: list[bool] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens of sequences still prefilling (or re-prefilling)
    num_decode_seqs: int = 0
    num_decode_context_tokens: int = 0  # sum of decode sequences' context lengths
    prefill_attention_work: int = 0  # sum over prefill chunks of chunk_len * context_len
    num_prefill_seqs: int = 0  # prefill chunks in the step
    prefill_chunk_lens: list[int] = field(default_factory=list)  # each chunk's new tokens
    prefill_context_lens: list[int] = field(
        default_factory=list
    )  # and its context (itself included)
    #: prefill_padded_attention_work once computed (-1: not yet, or chunks added since):
    #: the engine's step record and the simulator's cost model both read it every step.
    _padded_work: int = -1
    blocks_to_swap_out: BlockMapping = field(default_factory=list)
    blocks_to_swap_in: BlockMapping = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    #: Prefix caching: prompt tokens the step's admissions found cached (not computed),
    #: and cached blocks evicted to make room in this step.
    num_cached_tokens: int = 0
    num_evicted_blocks: int = 0
    #: Requests that ended outside any step (rejected on arrival, aborted) since the
    #: previous step: reported with this one, so every end is in exactly one record.
    ended_between_steps: list[Sequence] = field(default_factory=list)
    #: When nothing is scheduled but something will become schedulable at a known
    #: time without any arrival (static batching's timeout), that time.
    wake_at: float | None = None

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def prefill_padded_attention_work(self) -> int:
        """The runner's padded prefill attention: per group of similar chunks
        (``engine.core.prefill_groups``, as the model groups them), its chunks times its
        longest chunk times its longest context."""
        if self._padded_work < 0:
            self._padded_work = padded_prefill_work(
                self.prefill_chunk_lens, self.prefill_context_lens
            )
        return self._padded_work

    @property
    def is_empty(self) -> bool:
        return not self.seqs and not self.blocks_to_swap_out and not self.blocks_to_swap_in

    def add(self, seq: Sequence, num_tokens: int) -> None:
        """Put ``num_tokens`` of ``seq``'s uncomputed tokens into the step and count them."""
        seq.num_scheduled_tokens = num_tokens
        self.seqs.append(seq)
        decoding = seq.is_decoding
        self.is_decode.append(decoding)
        if decoding:
            self.num_decode_seqs += 1
            self.num_decode_context_tokens += seq.num_tokens
        else:
            context = seq.num_computed_tokens + num_tokens
            self.num_prefill_tokens += num_tokens
            self.prefill_attention_work += num_tokens * context
            self.num_prefill_seqs += 1
            self.prefill_chunk_lens.append(num_tokens)
            self.prefill_context_lens.append(context)
            self._padded_work = -1
