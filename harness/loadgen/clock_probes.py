"""The clock probes of a distributed run over Locust's messages (docs/loadgen.md).

At the start the master pings each worker ``clock.NUM_PROBES`` times
(``schedscope_ping``: ``seq``, ``t0``), each worker answers at once (``answer_ping``:
``schedscope_pong`` with its ``t1``, ``t2``), and the master keeps each worker's best
probe as its clock offset (``ClockProbes.estimate``; the arithmetic: ``clock.py``). A
pong the master cannot use raises ``clock.BadProbe`` (``ClockProbes.add_pong``); the
master refuses its sender through its guard (``master_side.py``).
"""

from __future__ import annotations

import logging

import gevent

from harness.loadgen import clock

log = logging.getLogger("schedscope.loadgen")


def answer_ping(environment, msg, **_kw) -> None:
    """A worker: answer the master's clock probe at once (t1, t2 on this clock)."""
    t1 = clock.unix_now()
    environment.runner.send_message(
        "schedscope_pong", {**msg.data, "t1": t1, "t2": clock.unix_now()}
    )


class ClockProbes:
    """The master's probes of its workers' clocks: the pings sent, the pongs taken."""

    def __init__(self) -> None:
        self.pings: dict[int, dict[int, float]] = {}  # worker -> seq -> t0
        self.pongs: dict[int, list[clock.Probe]] = {}  # worker -> its probes

    def add_pong(self, worker: int, pong: object, t3: float) -> None:
        """The probe of ``worker``'s pong, received at ``t3``; raises ``clock.BadProbe``
        for one that answers no ping of the master's to that worker, or is impossible."""
        # a pong of the worker pinged, answering a ping of the master's, possible
        probe = clock.probe(self.pings.get(worker, {}), pong, t3)
        self.pongs.setdefault(worker, []).append(probe)

    def estimate(self, runner, clients: dict[int, str]) -> dict[int, dict]:
        """The master: each worker's clock offset, best of clock.NUM_PROBES round trips
        (``clients``: worker index -> Locust client id)."""
        self.pongs = {}
        self.pings = {i: {} for i in clients}
        for n in range(clock.NUM_PROBES):
            for i, cid in clients.items():
                t0 = self.pings[i][n] = clock.unix_now()
                runner.send_message("schedscope_ping", {"seq": n, "t0": t0}, client_id=cid)
            deadline = clock.unix_now() + 1.0
            while clock.unix_now() < deadline and any(
                len(self.pongs.get(i, ())) <= n for i in clients
            ):
                gevent.sleep(0.002)
        offsets = {}
        for i in clients:
            if self.pongs.get(i):
                offsets[i] = clock.best(self.pongs[i])
            else:
                log.warning("schedscope: worker %d answered no clock probe; offset taken as 0", i)
        for i, est in sorted(offsets.items()):
            log.info(
                "schedscope: worker %d clock offset %+.4f s ± %.4f s",
                i,
                est["offset_s"],
                est["uncertainty_s"],
            )
        return offsets
