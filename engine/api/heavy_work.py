"""The budget of CPU-heavy request work: parsing, validating and tokenizing a large body,
and encoding a large response, on a worker thread, at most ``limit`` at a time, handed
out fairly.

A worker thread alone does not keep the event loop responsive: it still holds the GIL
while it parses, so eight concurrent 900 KB bodies on eight threads left ``/health``
waiting 2 s. One at a time, the loop shares the GIL with one worker; the other bodies
wait their turn without costing anything.

Waiting in one line (first come, first served) let one client's flood take the budget:
a valid 100 KB chat waited 14 s behind 24 concurrent 1 MB ``/tokenize`` bodies. So a
free slot goes to the clients with work waiting in turn (round robin: a client gets at
most one slot per round while others wait), and within a client alternately to its
smallest waiting job and to its oldest: a small body waits for at most a couple of jobs
of its own client and one of each other waiting client's, whatever is queued, and a
large one is never passed over for ever (every other turn of its client goes to the
oldest). Bodies of 64 KiB and less never come here: they are parsed on the event loop
at once (engine.api.generation.OFFLOAD_PARSE_BYTES).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Waiter:
    cost: int
    seq: int  # arrival order
    granted: asyncio.Future = field(repr=False)


class HeavyWork:
    """Runs ``fn(*args)`` on a worker thread once the budget grants it a slot (see the
    module docstring for the order). ``client`` is who asked (the peer address: every
    job of one client waits in one line), ``cost`` how heavy the job is (the body's
    bytes)."""

    def __init__(self, limit: int = 1) -> None:
        self.limit = limit
        self._running = 0
        #: Clients with work waiting, in the order of their next turn.
        self._waiting: dict[Hashable, list[_Waiter]] = {}
        #: Clients whose next turn goes to their oldest job rather than their smallest.
        self._oldest_next: set[Hashable] = set()
        self._seq = itertools.count()

    @property
    def num_waiting(self) -> int:
        return sum(len(jobs) for jobs in self._waiting.values())

    @property
    def num_running(self) -> int:
        return self._running

    async def run(self, fn: Callable[..., Any], *args: Any, client: Hashable = None, cost: int = 0):
        await self._acquire(client, cost)
        # The slot frees when the work ends, not when its caller does: a client that
        # hangs up cannot stop a thread that is already parsing its body.
        work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        work.add_done_callback(self._finished)
        return await asyncio.shield(work)

    async def _acquire(self, client: Hashable, cost: int) -> None:
        if self._running < self.limit and not self._waiting:
            self._running += 1
            return
        waiter = _Waiter(cost, next(self._seq), asyncio.get_running_loop().create_future())
        self._waiting.setdefault(client, []).append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release()  # granted as its caller left: the slot goes on
            else:
                self._withdraw(client, waiter)
            raise

    def _withdraw(self, client: Hashable, waiter: _Waiter) -> None:
        jobs = self._waiting.get(client)
        if jobs is not None and waiter in jobs:
            jobs.remove(waiter)
            if not jobs:
                del self._waiting[client]
                self._oldest_next.discard(client)

    def _finished(self, work: asyncio.Future) -> None:
        self._release()
        if not work.cancelled():
            work.exception()  # retrieved: a caller that left must not leave it unseen

    def _release(self) -> None:
        self._running -= 1
        while self._running < self.limit and self._waiting:
            client = next(iter(self._waiting))
            # A caller cancelled a moment ago has not withdrawn yet: skip it.
            jobs = [w for w in self._waiting.pop(client) if not w.granted.done()]
            if not jobs:
                self._oldest_next.discard(client)
                continue
            if client in self._oldest_next:
                self._oldest_next.discard(client)
                chosen = jobs[0]
            else:
                chosen = min(jobs, key=lambda w: (w.cost, w.seq))
                self._oldest_next.add(client)
            jobs.remove(chosen)
            if jobs:
                self._waiting[client] = jobs  # to the back of the round
            else:
                self._oldest_next.discard(client)
            self._running += 1
            chosen.granted.set_result(None)
