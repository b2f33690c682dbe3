"""Sessions in the simulator: each turn after a session's first arrives, on the virtual
clock, when the turn before it has ended plus the client's round trip and the turn's
think time; its prompt is the conversation so far and the answer the engine actually
generated (``sim_prompts.later_turn_prompt``). A turn that does not finish ``ok`` ends its
session: its later turns are never sent, and each gets a row that says so (as the load
generator writes them), so nothing planned is dropped silently.
"""

from __future__ import annotations

from engine.core.sequence import Sequence, SequenceStatus
from harness.profiles import RequestSpec, SessionSpec
from harness.simulate import sim_prompts

#: A turn that ended so: its session goes on.
_OK = (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH)


def session_ended_error(turn: int) -> str:
    """The ``error`` of a turn never sent because turn ``turn`` of its session failed."""
    return f"not sent: its session ended when turn {turn} failed"


class SessionTurns:
    """The state of every session of a simulation: which turn each is at, the prompt
    and answer of its last turn."""

    def __init__(self, sessions: list[SessionSpec], round_trip_s: float) -> None:
        self.sessions = sessions
        self.round_trip_s = round_trip_s
        self._at: dict[str, tuple[SessionSpec, int]] = {}  # request id -> (session, turn index)
        self.unsent: list[tuple[RequestSpec, str]] = []  # turns never sent, and why

    def first_turn(self, session: SessionSpec) -> tuple[RequestSpec, list[int]]:
        spec = session.turns[0]
        self._at[spec.request_id] = (session, 0)
        return spec, sim_prompts.first_turn_prompt(spec)

    def owns(self, request_id: str) -> bool:
        return request_id in self._at

    def ended(self, seq: Sequence, now: float) -> tuple[float, RequestSpec, list[int]] | None:
        """``seq`` (a session's turn) ended at its finished time (else ``now``): the
        session's next turn — when it arrives, its spec, its prompt — or None when the
        session is over (its last turn, or a failed one: the rest are recorded unsent)."""
        session, i = self._at.pop(seq.request_id)
        if seq.status not in _OK:
            for spec in session.turns[i + 1 :]:
                self.unsent.append((spec, session_ended_error(i + 1)))
            return None
        if i + 1 >= len(session.turns):
            return None
        spec = session.turns[i + 1]
        end = seq.finished_time if seq.finished_time is not None else now
        assert spec.think_time_s is not None, "a later turn has a think time"
        at = end + self.round_trip_s + spec.think_time_s
        prompt = sim_prompts.later_turn_prompt(spec, seq.prompt_token_ids, seq.output_token_ids)
        self._at[spec.request_id] = (session, i + 1)
        return at, spec, prompt
