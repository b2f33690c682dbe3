"""The dispatcher's sessions at the end of a run, and the master's intake of their rows:
a stop while a session waits for an in-flight slot cuts it (its turns "not sent" because
the run stopped), never "failed"; every turn of every session is a row of the plan that
the master takes from the worker whose share holds the session."""

from __future__ import annotations

import gevent

from harness.loadgen.client import OpenAIClient
from harness.loadgen.clock import unix_now
from harness.loadgen.dispatcher import NOT_SENT, TURN_NOT_SENT, Dispatcher
from harness.loadgen.intake import Intake
from harness.loadgen.split import share
from harness.profiles import build_plan
from tests.harness.profiles.test_sessions import session_profile


class ListWriter:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def write(self, row: dict) -> None:
        self.rows.append(row)


class SlowClient(OpenAIClient):
    """Builds rows and messages as the real client; each send takes a while and ends ok."""

    def __init__(self) -> None:
        super().__init__(None, endpoint="completions", model="m", run_id="run-1")

    def send(self, row, spec, messages=None, answer=None):
        row["sent_at"] = 1.0
        gevent.sleep(0.3)
        row["status"] = "ok"
        row["last_token_at"] = 1.0
        if answer is not None:
            answer.append("w5 w6")
        return None


def test_a_stop_while_sessions_wait_for_a_slot_cuts_them_and_fails_none():
    plan = build_plan(session_profile(turns_high=4, think=0.01, rate=4.0))
    mine = share(plan, 0, 1)
    assert len(mine.sessions) >= 2
    writer = ListWriter()
    # every session due at once: one holds the slot, the others wait for it; the
    # single-turn requests are not due in this test
    for s in mine.sessions:
        s.start_at = 0.0
    for spec in mine.open_requests:
        spec.scheduled_at = 1e6
    dispatcher = Dispatcher(SlowClient(), writer, plan, mine, unix_now(), max_in_flight=1)
    runner = gevent.spawn(dispatcher.run)
    gevent.sleep(0.1)
    dispatcher.drain()
    runner.join(timeout=10)
    assert runner.dead
    turns = [t.request_id for s in mine.sessions for t in s.turns]
    rows = {r["request_id"]: r for r in writer.rows if r["session_id"] is not None}
    assert sorted(rows) == sorted(turns)  # one row each
    assert dispatcher.turns_after_failure == 0
    errors = {r["error"] for r in rows.values() if r["status"] != "ok"}
    assert errors <= {NOT_SENT, TURN_NOT_SENT}, errors


def test_the_master_takes_every_turn_from_the_worker_whose_share_holds_its_session():
    plan = build_plan(session_profile())
    workers = 3
    intake = Intake("run-1", plan, workers)
    for w in range(workers):
        for session in share(plan, w, workers).sessions:
            for turn in session.turns:
                assert intake.owner(turn.request_id) == w
    assert intake.owner("sess-1-s9999999-t001") is None
