"""The digest of a request schedule: 16 hex digits that are equal exactly when two
schedules send the same requests at the same offsets.

One formula, two users: ``schedule_digest(rows)`` over (request id, class, prompt
tokens, max tokens, arrival offset) rows, which the gate computes from a run's recorded
rows (``harness.gate.sides.schedule_digest``: a baseline must replay the schedule it
records), and ``plan_digest(plan)`` over a plan before anything is sent, which a
distributed run's workers compare with their master's (``harness.loadgen.plan_check``).
An open-loop plan's digest is the gate's digest of the rows its run records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from harness.profiles.schedule import CLOSED_CHUNK, Plan

#: A schedule row: request id, class, prompt tokens, max tokens (the output length the
#: request asks for), arrival offset in seconds (None: a closed loop's, not fixed).
ScheduleRow = tuple[str, str, int, int, float | None]


def _line(values: Iterable[object]) -> str:
    return ",".join("" if v is None else str(v) for v in values)


def schedule_digest(rows: Iterable[ScheduleRow], extra: Iterable[str] = ()) -> str:
    """16 hex digits over the rows (in request-id order, offsets to the microsecond)
    and ``extra`` lines after them."""
    lines = [
        _line((rid, cls, prompt, max_tokens, None if at is None else round(at * 1e6)))
        for rid, cls, prompt, max_tokens, at in sorted(rows, key=lambda r: r[0] or "")
    ]
    text = "\n".join([*lines, *extra])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_digest(plan: Plan) -> str:
    """The digest of everything ``plan`` schedules: every open-loop request, every turn
    of every session (its start, and each later turn's think time), the shared prompt
    segments, and for each closed phase its window, concurrency and first CLOSED_CHUNK
    requests (the rest come from the same seeded draws). The seed and the profile's name
    are in the request ids. A plan without sessions or shared segments has the digest of
    the rows its run records (``schedule_digest``)."""
    rows: list[ScheduleRow] = [
        (s.request_id, s.class_name, s.prompt_tokens, s.output_tokens, s.scheduled_at)
        for s in plan.open_loop_requests()
    ]
    extra: list[str] = []
    for session in plan.sessions():
        for t in session.turns:
            rows.append((t.request_id, t.class_name, t.prompt_tokens, t.output_tokens, None))
            think = None if t.think_time_s is None else round(t.think_time_s * 1e6)
            extra.append(_line(("turn", t.request_id, think)))
        extra.append(_line(("session", session.session_id, round(session.start_at * 1e6))))
    for s in plan.open_loop_requests() + [t for x in plan.sessions() for t in x.turns]:
        if s.shared:
            extra.append(_line(("shared", s.request_id, *(f"{k}:{n}" for k, n in s.shared))))
    closed = [p for p in plan.phases if p.kind == "closed"]
    for p in closed:
        for k in range(CLOSED_CHUNK):
            s = p.request_at(k)
            rows.append((s.request_id, s.class_name, s.prompt_tokens, s.output_tokens, None))
            if s.shared:
                extra.append(_line(("shared", s.request_id, *(f"{k}:{n}" for k, n in s.shared))))
    extra += [
        _line(("closed", p.index, round(p.start_s * 1e6), round(p.end_s * 1e6), p.concurrency))
        for p in closed
    ]
    return schedule_digest(rows, extra)
