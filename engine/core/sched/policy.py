"""Scheduling policies as orderings.

A policy gives each request a *static* key when it arrives; lower keys are served
first and, among running requests, the highest key is preempted first. Ties fall
to arrival order (``Sequence.seq_no``).

Why static keys are enough, aging included: with linear aging at one rate, the
effective key at time ``t`` is ``base - rate * (t - arrival) = (base + rate *
arrival) - rate * t``. The last term is the same for every request, so the order
is that of ``base + rate * arrival`` at all times, and a heap with that fixed key
never needs re-sorting. The hard bound ``max_wait_s`` is not an ordering: the
scheduler handles it by watching the request that has waited longest.

One policy orders waiting requests by something that changes while they wait: lpm
(longest prefix match) by how much of each prompt the prefix cache holds. Its static
key is the arrival time, as fcfs's (the running set's order, so preemption victims are
the latest arrivals, and the waiting queue's arrival order); which waiting request is
admitted next is decided each step over a bounded window of that queue
(``engine.core.sched.prefix_order``), with :meth:`LpmPolicy.window_key`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import SCHEDULING_POLICIES

if TYPE_CHECKING:
    from engine.config import SchedulerConfig
    from engine.core.sequence import Sequence


class Policy:
    """One ordering of requests. Subclasses only define :meth:`base_key`."""

    name = ""
    #: Whether a waiting request with a better key may take the place (blocks, slot)
    #: of a running request with a worse one, as vLLM's priority scheduling does.
    preempts_for_waiting = False

    def __init__(self, aging_rate: float = 0.0) -> None:
        self.aging_rate = aging_rate

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.aging_rate)

    def base_key(self, seq: Sequence) -> float:
        raise NotImplementedError

    def key(self, seq: Sequence) -> float:
        """The static key: lower is served earlier."""
        return self.base_key(seq) + self.aging_rate * seq.arrival_time


#: The registry: the class of every policy by name. The names themselves have one home,
#: the knob's values (``engine.config.SCHEDULING_POLICIES``): a policy is added there and
#: its class registered here.
POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    if cls.name not in SCHEDULING_POLICIES:
        raise ValueError(
            f"policy {cls.name!r} is not a value of the scheduling_policy knob: add it to "
            "engine.config.SCHEDULING_POLICIES"
        )
    POLICIES[cls.name] = cls
    return cls


@register
class FcfsPolicy(Policy):
    """First come, first served: arrival time is the key (aging changes nothing)."""

    name = "fcfs"

    def base_key(self, seq: Sequence) -> float:
        return 0.0

    def key(self, seq: Sequence) -> float:
        return seq.arrival_time


@register
class SjfPolicy(Policy):
    """Shortest job first by an estimated job size in tokens.

    ``request`` estimates prompt + ``max_tokens`` (all a server knows);
    ``oracle`` uses the true output length when the simulator knows it.
    """

    name = "sjf"

    def __init__(self, aging_rate: float = 0.0, estimator: str = "request") -> None:
        super().__init__(aging_rate)
        self.estimator = estimator

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> Policy:
        return cls(config.aging_rate, config.sjf_size_estimator)

    def base_key(self, seq: Sequence) -> float:
        if self.estimator == "oracle" and seq.oracle_output_tokens is not None:
            return float(seq.num_prompt_tokens + seq.oracle_output_tokens)
        return float(seq.num_prompt_tokens + seq.params.max_tokens)


@register
class PriorityPolicy(Policy):
    """vLLM's priority scheduling: lower value is served earlier, arrival breaks ties."""

    name = "priority"
    preempts_for_waiting = True

    def base_key(self, seq: Sequence) -> float:
        return float(seq.priority)


@register
class LpmPolicy(Policy):
    """Longest prefix match (SGLang's ``lpm``): the waiting request whose prompt has the
    most tokens in the prefix cache first, ties by arrival; FCFS everywhere else.

    The cached length changes as the cache does, so it is no static key: each step the
    admission ranks the first :attr:`window` waiting requests in arrival order by
    :meth:`window_key` (``engine.core.sched.prefix_order``), and takes the rest of the
    queue in arrival order. The static key is the arrival time, as fcfs's: the running
    set's order (preemption victims are the latest arrivals) and the queue's order.
    """

    name = "lpm"
    #: Waiting requests ranked per step, the oldest; the rest wait in arrival order. A
    #: bound on the per-step cost (one prefix lookup each); SGLang's lpm bounds it at the
    #: same number, ordering the whole queue FCFS while more than 128 wait.
    WINDOW = 128

    def __init__(self, aging_rate: float = 0.0, window: int | None = None) -> None:
        super().__init__(aging_rate)
        window = self.WINDOW if window is None else window
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window

    def base_key(self, seq: Sequence) -> float:
        return 0.0

    def key(self, seq: Sequence) -> float:
        return seq.arrival_time

    def window_key(self, seq: Sequence, cached_tokens: int) -> float:
        """The rank of waiting ``seq`` whose prompt has ``cached_tokens`` tokens in the
        prefix cache: lower is admitted earlier. Aging as sjf's: the aged key at ``now``,
        ``-cached_tokens - aging_rate * (now - arrival)``, orders as this one does (the
        ``now`` term is every request's)."""
        return self.aging_rate * seq.arrival_time - cached_tokens


class ReversedPolicy(Policy):
    """Another policy's order turned around: its worst request first, aging kept.

    Not registered (no knob selects it): a broken ordering that ``engine.faults``
    plants (``sjf_order=reversed``) to test a latency gate. The engine hands it to the
    scheduler in place of the configured policy, whose name it keeps. Only for a
    policy that orders by :meth:`Policy.base_key` (fcfs ignores it)."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner.aging_rate)
        self.inner = inner
        self.name = inner.name
        self.preempts_for_waiting = inner.preempts_for_waiting

    def base_key(self, seq: Sequence) -> float:
        return -self.inner.base_key(seq)


#: The ``--scheduling-policy`` knob's values, each with its class registered above.
POLICY_NAMES: tuple[str, ...] = SCHEDULING_POLICIES
_unregistered = [name for name in POLICY_NAMES if name not in POLICIES]
if _unregistered:
    raise ImportError(f"scheduling policies without a registered class: {_unregistered}")


def make_policy(config: SchedulerConfig) -> Policy:
    return POLICIES[config.scheduling_policy].from_config(config)
