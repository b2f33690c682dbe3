"""One worker's share of a plan, and the duration scale.

Request i of the open-loop schedule (its ``index``) belongs to worker ``i mod W``;
loop j of a closed phase with concurrency N belongs to worker ``j mod W`` and sends
that phase's specs ``j, j + N, j + 2N, ...``; session s (its ``index``) belongs to
worker ``s mod W`` whole: its turns are sent one after another by one process, never
split between workers. The union of the shares is the whole plan, with no id twice,
whatever W is: a run in one process and a run in several send the same request ids at
the same scheduled instants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.profiles import Plan, RequestSpec, SessionSpec


@dataclass(frozen=True)
class ClosedLoop:
    """Loop ``loop`` of closed phase ``phase`` (its plan index): sends the phase's
    specs ``loop, loop + concurrency, ...`` back to back from start_s to end_s."""

    phase: int
    loop: int
    concurrency: int
    start_s: float
    end_s: float

    def spec_index(self, m: int) -> int:
        return self.loop + m * self.concurrency


@dataclass(frozen=True)
class Share:
    """What one worker sends: open-loop specs in time order, closed loops and sessions
    (in start order)."""

    worker: int
    workers: int
    open_requests: list[RequestSpec]
    closed_loops: list[ClosedLoop]
    sessions: list[SessionSpec] = field(default_factory=list)

    @property
    def num_open(self) -> int:
        return len(self.open_requests)

    @property
    def scheduled_ids(self) -> list[str]:
        """The request id of every row this share writes whatever happens: its open-loop
        requests and every turn of its sessions (a turn never sent gets a row that says
        why)."""
        ids = [s.request_id for s in self.open_requests]
        ids += [t.request_id for session in self.sessions for t in session.turns]
        return ids


def share(plan: Plan, worker: int, workers: int) -> Share:
    """Worker ``worker``'s share (0 <= worker < workers) of ``plan``."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}: need 0 <= worker < workers")
    open_requests = [s for s in plan.open_loop_requests() if s.index % workers == worker]
    loops = [
        ClosedLoop(p.index, j, p.concurrency, p.start_s, p.end_s)
        for p in plan.phases
        if p.concurrency is not None  # a closed phase
        for j in range(worker, p.concurrency, workers)
    ]
    sessions = [s for s in plan.sessions() if s.index % workers == worker]
    return Share(worker, workers, open_requests, loops, sessions)
