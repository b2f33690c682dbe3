"""Sending one worker's share at its scheduled instants (runs under gevent).

Open loop: one greenlet walks the share in time order, sleeps until each request's
instant (run start + ``scheduled_at``) and spawns a greenlet for it there, whether or
not earlier requests have finished: a slow server never delays an arrival, so
latency from ``scheduled_at`` is free of coordinated omission. An in-flight cap
(``--max-in-flight``) protects the generator: a request that finds it reached waits for
a slot, and its row says ``in_flight_capped`` (its lag shows how long).

Closed loop: each of the share's loops sends its next request as soon as the previous
one ended, until the phase ends; a 429 waits its Retry-After first.

Sessions: each session of the share starts at its scheduled instant, as an open-loop
request does, in a greenlet of its own that sends its turns one after another: turn
``k + 1`` is due its think time after turn ``k``'s last token arrived, with the whole
conversation so far (chat messages: the system prompt, every earlier message and the
answer actually received, the new message). A turn that does not end ``ok`` ends its
session: the turns after it are not sent, and their rows say why (never retried
silently).

Every scheduled request gets exactly one row: finished, failed, killed in flight when
the run stopped (``aborted``), or never sent because the run stopped first (or, a
session's turn, because its session ended on a failed turn).

Stopping comes in two steps, so that Locust's ``--stop-timeout`` can let what is in flight
finish: ``drain()`` stops sending (no request leaves after it: the open-loop requests not
sent get "not sent" rows, closed loops end after their current request) and ``run()``
returns when the last request in flight has ended; ``stop()`` then kills whatever is still
in flight (its rows: ``aborted``, "in flight when the run stopped", passed to ``on_row``
with ``cut=True``). ``cut_in_flight`` and ``not_sent`` count the two kinds of row the
stop made; "not sent" rows are not passed to ``on_row`` (they are no requests).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import gevent
import gevent.event
from gevent.lock import BoundedSemaphore
from gevent.pool import Group

from harness.loadgen.client import OpenAIClient
from harness.loadgen.clock import unix_now
from harness.loadgen.records import RecordWriter
from harness.loadgen.split import ClosedLoop, Share
from harness.profiles import Plan

log = logging.getLogger(__name__)

#: The ``error`` of a row killed in flight by ``Dispatcher.stop``.
IN_FLIGHT_WHEN_STOPPED = "in flight when the run stopped"
#: The ``error`` of an open-loop row never sent because the run stopped first.
NOT_SENT = "not sent: the run stopped before its scheduled instant"
#: The ``error`` of a session's later turn never sent because the run stopped first.
TURN_NOT_SENT = "not sent: the run stopped before this turn of its session"


def session_ended(turn: int) -> str:
    """The ``error`` of a turn never sent because turn ``turn`` of its session failed."""
    return f"not sent: its session ended when turn {turn} failed"


class Dispatcher:
    def __init__(
        self,
        client: OpenAIClient,
        writer: RecordWriter,
        plan: Plan,
        share: Share,
        run_start: float,
        max_in_flight: int,
        on_row: Callable[[dict, bool], None] = lambda row, cut: None,
    ) -> None:
        self.client = client
        self.writer = writer
        self.plan = plan
        self.share = share
        self.run_start = run_start
        self.max_in_flight = max_in_flight
        self.on_row = on_row
        self._slots = BoundedSemaphore(max_in_flight)
        self._group = Group()
        self._next_open = 0
        self._next_session = 0
        #: session id -> the index of its first turn that has no row yet
        self._session_next: dict[str, int] = {}
        self._stopping = False
        self._rows: set[int] = set()  # id() of rows in flight
        self._workers: list[gevent.Greenlet] = []
        self._open: gevent.Greenlet | None = None
        self._starts: gevent.Greenlet | None = None  # starts the sessions
        self._wake = gevent.event.Event()  # set when sending stops: closed loops stop waiting
        self.finished = gevent.event.Event()
        self.cut_in_flight = 0  # rows killed in flight by stop()
        self.not_sent = 0  # open-loop rows (and session turns) never sent: the run stopped
        self.turns_after_failure = 0  # session turns never sent: a turn before them failed
        self.stopped_at: float | None = None  # when drain() or stop() ended the sending

    # -- running --------------------------------------------------------------------
    def run(self) -> None:
        """Send the share; returns when every request has its row (after ``drain()``: when
        the requests already sent have ended)."""
        self._open = gevent.spawn(self._open_loop)
        self._starts = gevent.spawn(self._session_starts)
        self._workers = [self._open, self._starts]
        self._workers += [gevent.spawn(self._closed_loop, loop) for loop in self.share.closed_loops]
        gevent.joinall(self._workers)
        self._group.join()
        self._write_unsent()
        self.finished.set()

    def _open_loop(self) -> None:
        specs = self.share.open_requests
        start = self.run_start
        sleep, now, spawn = gevent.sleep, unix_now, self._group.spawn
        while self._next_open < len(specs) and not self._stopping:
            spec = specs[self._next_open]
            at = start + spec.open_at
            delay = at - now()
            if delay > 0:
                sleep(delay)
                if self._stopping:
                    break
            capped = self._slots.locked()
            if capped:
                self._slots.acquire()
            else:
                self._slots.acquire(blocking=False)
            row = self.client.new_row(spec, "open", at, capped)
            self._next_open += 1
            spawn(self._one, spec, row, True)

    def _closed_loop(self, loop: ClosedLoop) -> None:
        phase = copy.copy(self.plan.phases[loop.phase])  # its own chunk cache
        phase._chunk = None
        begin, end = self.run_start + loop.start_s, self.run_start + loop.end_s
        wait = self._wake.wait  # a sleep that drain() ends
        delay = begin - unix_now()
        if delay > 0:
            wait(delay)
        m = 0
        while not self._stopping and unix_now() < end:
            spec = phase.request_at(loop.spec_index(m))
            m += 1
            row = self.client.new_row(spec, "closed", unix_now(), False)
            retry_after = self._one(spec, row, False)
            left = end - unix_now()
            if left <= 0 or self._stopping:
                break
            if retry_after:
                wait(min(retry_after, left))
            elif row["status"] == "error" and row["http_status"] is None:
                wait(min(0.05, left))  # connection refused: do not spin

    def _session_starts(self) -> None:
        sessions = self.share.sessions
        start = self.run_start
        while self._next_session < len(sessions) and not self._stopping:
            session = sessions[self._next_session]
            delay = start + session.start_at - unix_now()
            if delay > 0:
                gevent.sleep(delay)
                if self._stopping:
                    break
            self._next_session += 1
            self._session_next[session.session_id] = 0
            self._group.spawn(self._session, session)

    def _session(self, session) -> None:
        """Send ``session``'s turns one after another (module docstring)."""
        history: list[dict] = []
        due = self.run_start + session.start_at
        for i, spec in enumerate(session.turns):
            if i:
                due += spec.think_time_s
                delay = due - unix_now()
                if delay > 0:
                    self._wake.wait(delay)  # a sleep that drain() ends
            if self._stopping:
                return  # its turns from i on get their rows in _write_unsent
            capped = self._slots.locked()
            if capped:
                self._slots.acquire()
            else:
                self._slots.acquire(blocking=False)
            if self._stopping:  # stopped while it waited for a slot: cut, not failed
                self._slots.release()
                return  # its turns from i on get their rows in _write_unsent
            row = self.client.new_row(spec, "session", due, capped)
            self._session_next[session.session_id] = i + 1
            messages = self.client.session_messages(spec, history)
            answer: list[str] = []
            self._one(spec, row, True, messages, answer)
            if row["status"] != "ok":
                for j, later in enumerate(session.turns[i + 1 :], start=i + 1):
                    # counted as written first: a worker's write may yield (its rows go to
                    # the master), and a stop there must not write the row again
                    self._session_next[session.session_id] = j + 1
                    unsent = self.client.new_row(later, "session", unix_now(), False)
                    unsent["error"] = session_ended(i + 1)
                    self.writer.write(unsent)
                    self.turns_after_failure += 1
                return
            history += [messages[-1], {"role": "assistant", "content": "".join(answer)}]
            due = row["last_token_at"] or unix_now()

    def _one(
        self,
        spec,
        row: dict,
        slot: bool,
        messages: list[dict] | None = None,
        answer: list[str] | None = None,
    ) -> float | None:
        if self._stopping:  # spawned at its instant, but the run stopped before it left
            if slot:
                self._slots.release()
            self._not_sent(row)
            return None
        key = id(row)
        self._rows.add(key)
        retry_after = None
        cut = False
        try:
            retry_after = self.client.send(row, spec, messages, answer)
        except gevent.GreenletExit:
            cut = True
            self.cut_in_flight += 1
            # when it was cut: its latencies are at least the time from its arrival to
            # here (censored, not dropped: harness/records/request_stats.py)
            row["cut_at"] = unix_now()
            row["status"] = "aborted"
            row["error"] = row["error"] or IN_FLIGHT_WHEN_STOPPED
            if row["first_token_at"] is not None:
                row["ttft_s"] = row["first_token_at"] - row["scheduled_at"]
                row["ttft_from_sent_s"] = row["first_token_at"] - row["sent_at"]
            raise
        except Exception as e:  # noqa: BLE001 - a bug must not lose the row
            log.exception("request %s failed in the client", spec.request_id)
            row["status"] = "error"
            row["error"] = f"client error: {type(e).__name__}: {e}"[:500]
        finally:
            self._rows.discard(key)
            if slot:
                self._slots.release()
            self.writer.write(row)
            try:
                self.on_row(row, cut)
            except Exception:  # noqa: BLE001
                log.exception("on_row failed")
        return retry_after

    # -- stopping -------------------------------------------------------------------
    def drain(self) -> None:
        """Stop sending, and let what is in flight finish: ``run()`` returns (and
        ``finished`` is set) when the last request in flight has ended."""
        if self._stopping or self.finished.is_set():
            return
        self._stopping = True
        self.stopped_at = unix_now()
        self._wake.set()
        for walker in (self._open, self._starts):
            if walker is not None:
                # Between two requests it waits in a sleep or for a slot: safe to kill there.
                walker.kill(block=False)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop sending; abort what is in flight; give every unsent open request its row."""
        if self.finished.is_set():
            return
        if not self._stopping:
            self._stopping = True
            self.stopped_at = unix_now()
        self._wake.set()
        gevent.sleep(0)  # requests spawned but not started write their "not sent" rows
        gevent.killall(self._workers, block=True, timeout=timeout_s)
        self._group.kill(block=True, timeout=timeout_s)
        self._write_unsent()
        self.finished.set()

    def _write_unsent(self) -> None:
        specs = self.share.open_requests
        for spec in specs[self._next_open :]:
            self._not_sent(self.client.new_row(spec, "open", self.run_start + spec.open_at, False))
        self._next_open = len(specs)
        for session in self.share.sessions:
            first = self._session_next.get(session.session_id, 0)
            for i, spec in enumerate(session.turns[first:], start=first):
                at = self.run_start + session.start_at if i == 0 else unix_now()
                self._not_sent(
                    self.client.new_row(spec, "session", at, False),
                    NOT_SENT if i == 0 else TURN_NOT_SENT,
                )
            self._session_next[session.session_id] = len(session.turns)
        self._next_session = len(self.share.sessions)

    def _not_sent(self, row: dict, error: str = NOT_SENT) -> None:
        row["error"] = error
        self.writer.write(row)
        self.not_sent += 1
