"""Requests sent back to back from several threads while a test looks at the server.

Used where a test needs a server that is busy (a queue, scrapes under load) rather than
a measured load: Locust drives the measured runs. Each thread has its own connection;
``request_for(thread, n)`` gives the body and headers of that thread's n-th request, so
the load is the same from run to run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from harness.serve.local_server import HttpClient

RequestFor = Callable[[int, int], tuple[dict, dict[str, str]]]


class BackgroundLoad:
    """``with BackgroundLoad(url, threads, request_for) as load:`` sends until the block
    ends; ``load.statuses`` holds every answer's HTTP status (0 for a connection error)."""

    def __init__(
        self,
        url: str,
        num_threads: int,
        request_for: RequestFor,
        *,
        timeout_s: float = 60.0,
        join_s: float = 60.0,
    ) -> None:
        self.url = url
        self.request_for = request_for
        self.timeout_s = timeout_s
        self.join_s = join_s
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [
            threading.Thread(target=self._send, args=(index,), daemon=True)
            for index in range(num_threads)
        ]

    @property
    def num_done(self) -> int:
        return len(self.statuses)

    @property
    def num_errors(self) -> int:
        return sum(status != 200 for status in self.statuses)

    def _send(self, thread: int) -> None:
        client = HttpClient(self.url, timeout=self.timeout_s)
        n = 0
        while not self.stop.is_set():
            body, headers = self.request_for(thread, n)
            n += 1
            try:
                status, _, _ = client.post_json("/v1/completions", body, headers)
            except OSError:
                status = 0
            self.statuses.append(status)
        client.close()

    def __enter__(self) -> BackgroundLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.join_s)
