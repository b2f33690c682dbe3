"""Sending one worker's share at its scheduled instants (runs under gevent).

Open loop: one greenlet walks the share in time order, sleeps until each request's
instant (run start + ``scheduled_at``) and spawns a greenlet for it there, whether or
not earlier requests have finished: a slow server never delays an arrival, so
latency from ``scheduled_at`` is free of coordinated omission. An in-flight cap
(``--max-in-flight``) protects the generator: a request that finds it reached waits for
a slot, and its row says ``in_flight_capped`` (its lag shows how long).

Closed loop: each of the share's loops sends its next request as soon as the previous
one ended, until the phase ends; a 429 waits its Retry-After first.

Every scheduled request gets exactly one row: finished, failed, killed in flight when
the run stopped (``aborted``), or never sent because the run stopped first.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

import gevent
import gevent.event
from gevent.lock import BoundedSemaphore
from gevent.pool import Group

from harness.loadgen.client import OpenAIClient
from harness.loadgen.records import RecordWriter
from harness.loadgen.split import ClosedLoop, Share
from harness.profiles import Plan

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        client: OpenAIClient,
        writer: RecordWriter,
        plan: Plan,
        share: Share,
        run_start: float,
        max_in_flight: int,
        on_row: Callable[[dict], None] = lambda row: None,
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
        self._stopping = False
        self._rows: set[int] = set()  # id() of rows in flight
        self._workers: list[gevent.Greenlet] = []
        self.finished = gevent.event.Event()

    # -- running --------------------------------------------------------------------
    def run(self) -> None:
        """Send the whole share; returns when every request has its row."""
        self._workers = [gevent.spawn(self._open_loop)]
        self._workers += [gevent.spawn(self._closed_loop, loop) for loop in self.share.closed_loops]
        gevent.joinall(self._workers)
        self._group.join()
        self.finished.set()

    def _open_loop(self) -> None:
        specs = self.share.open_requests
        start = self.run_start
        sleep, now, spawn = gevent.sleep, time.time, self._group.spawn
        while self._next_open < len(specs) and not self._stopping:
            spec = specs[self._next_open]
            at = start + spec.scheduled_at
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
        delay = begin - time.time()
        if delay > 0:
            gevent.sleep(delay)
        m = 0
        while not self._stopping and time.time() < end:
            spec = phase.request_at(loop.spec_index(m))
            m += 1
            row = self.client.new_row(spec, "closed", time.time(), False)
            retry_after = self._one(spec, row, False)
            left = end - time.time()
            if left <= 0:
                break
            if retry_after:
                gevent.sleep(min(retry_after, left))
            elif row["status"] == "error" and row["http_status"] is None:
                gevent.sleep(min(0.05, left))  # connection refused: do not spin

    def _one(self, spec, row: dict, slot: bool) -> float | None:
        key = id(row)
        self._rows.add(key)
        retry_after = None
        try:
            retry_after = self.client.send(row, spec)
        except gevent.GreenletExit:
            row["status"] = "aborted"
            row["error"] = row["error"] or "in flight when the run stopped"
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
                self.on_row(row)
            except Exception:  # noqa: BLE001
                log.exception("on_row failed")
        return retry_after

    # -- stopping -------------------------------------------------------------------
    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop sending; abort what is in flight; give every unsent open request its row."""
        if self.finished.is_set():
            return
        self._stopping = True
        gevent.killall(self._workers, block=True, timeout=timeout_s)
        self._group.kill(block=True, timeout=timeout_s)
        for spec in self.share.open_requests[self._next_open :]:
            row = self.client.new_row(spec, "open", self.run_start + spec.scheduled_at, False)
            row["error"] = "not sent: the run stopped before its scheduled instant"
            self.writer.write(row)
        self._next_open = len(self.share.open_requests)
        self.finished.set()
