"""Batching regimes: when waiting requests may join the running batch.

The scheduler's order of business is fixed (``engine.core.sched.scheduler``); a regime decides
the admissions around it:

- :class:`ContinuousBatching` (vLLM, chunked prefill on): requests join and leave
  every step. Before the running requests: max-wait promotions, then (under a policy
  that preempts for waiting requests) the best waiting request's claim on worse
  running ones. After them and the swap-ins: new prefills, chunked under the budget.
- :class:`PrefillFirstBatching` (vLLM v0 with chunked prefill off): a step that can
  admit new prefills runs only those, and the running requests sit it out; none are
  admitted while requests are swapped out. This is how a running set outgrows the
  token budget (trap 1 in docs/traps.md).
- :class:`StaticBatching`: collect up to ``max_num_seqs`` requests (or wait at most
  ``static_batch_timeout_s`` for them), run the batch to completion, no joins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine.core import decisions as d

if TYPE_CHECKING:
    from engine.config import SchedulerConfig
    from engine.core.sched.admission import Admission
    from engine.core.sched.scheduler_output import SchedulerOutput
    from engine.core.sched.waiting_queue import WaitingQueue
    from engine.core.sequence import Sequence


class SchedulerState(Protocol):
    """All a batching regime may see of the scheduler: the three queues (read only),
    the admission steps it orders, whether running decodes preempted in this step,
    and the record of running requests left out of it."""

    @property
    def waiting(self) -> WaitingQueue: ...

    @property
    def running(self) -> list[Sequence]: ...

    @property
    def swapped(self) -> list[Sequence]: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def decode_preempted(self) -> bool: ...

    def record_idle(
        self, out: SchedulerOutput, now: float, idle: list[Sequence], reason: str
    ) -> None: ...


class BatchingRegime:
    #: Whether a swapped-out request yields its swap-in to a better waiting request
    #: (it may be the one that caused the swap).
    swap_ins_yield_to_waiting = False
    #: Whether requests waiting change nothing of a step until its running requests are
    #: scheduled: they are admitted only into what the running requests leave (unless
    #: :meth:`engine.core.sched.admission.Admission.acts_ahead_of_running`).
    admits_after_running_only = False

    def admit_before_running(
        self, sched: SchedulerState, out: SchedulerOutput, now: float, budget: int
    ) -> int | None:
        """Admissions ahead of the running requests; returns the budget left, or None
        when the step is complete as it is."""
        return budget

    def admit_after_running(
        self, sched: SchedulerState, out: SchedulerOutput, now: float, budget: int
    ) -> None:
        """Admissions into what the running requests and swap-ins left of the step."""


class ContinuousBatching(BatchingRegime):
    admits_after_running_only = True

    def __init__(self, preempts_for_waiting: bool) -> None:
        self.swap_ins_yield_to_waiting = preempts_for_waiting

    def admit_before_running(self, sched, out, now, budget):
        return sched.admission.ahead_of_running(out, now, budget)

    def admit_after_running(self, sched, out, now, budget):
        if not len(sched.waiting) or budget <= 0:
            return
        if sched.decode_preempted:
            # Running decodes had to preempt for room: admitting more into the same
            # step would only be preempted again (vLLM does the same).
            sched.admission.note_wait(out, now, d.REASON_OUT_OF_BLOCKS)
        else:
            sched.admission.waiting_requests(out, now, budget)


class PrefillFirstBatching(BatchingRegime):
    def admit_before_running(self, sched, out, now, budget):
        budget = sched.admission.ahead_of_running(out, now, budget)
        if len(sched.waiting) and not sched.swapped:
            sched.admission.waiting_requests(out, now, budget)
        if not out.seqs:
            return budget
        idle = [seq for seq in sched.running if not seq.num_scheduled_tokens]
        sched.record_idle(out, now, idle, d.REASON_PREFILL_PRIORITY)
        return None


class StaticBatching(BatchingRegime):
    def __init__(self, max_num_seqs: int, timeout_s: float) -> None:
        self.max_num_seqs = max_num_seqs
        self.timeout_s = timeout_s
        self._open_since: float | None = None  # when the batch being formed got its first wait

    def admit_before_running(self, sched, out, now, budget):
        if sched.running or sched.swapped:
            if len(sched.waiting):
                sched.admission.note_wait(out, now, d.REASON_STATIC_BATCH)
            return budget
        num_waiting = len(sched.waiting)
        if not num_waiting:
            self._open_since = None
            return None
        if self._open_since is None:
            self._open_since = now
        deadline = self._open_since + self.timeout_s
        if num_waiting < self.max_num_seqs and now < deadline:
            out.wake_at = deadline
            return None
        self._open_since = None
        sched.admission.batch(out, now)
        return budget


def make_batching(config: SchedulerConfig, preempts_for_waiting: bool) -> BatchingRegime:
    if config.batching == "static":
        return StaticBatching(config.max_num_seqs, config.static_batch_timeout_s)
    if config.enable_chunked_prefill:
        return ContinuousBatching(preempts_for_waiting)
    return PrefillFirstBatching()
