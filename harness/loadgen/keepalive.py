"""A pooled keep-alive connection the server had already closed.

Servers close idle keep-alive connections (vLLM's uvicorn after 5 s). The pool checks a
connection before reusing it, but a close that crosses the request on the wire (the
server closed as the request left) is seen only as the request fails: the server
closed the connection before any byte of a response, so it never took the request.
Such a request is sent once more on a fresh connection (``OpenAIClient.send``; the
row's ``retried`` says so, docs/loadgen.md). Only that case: a failure on a fresh
connection, or after any byte of a response, is the request's error.

:class:`ReuseWatch` tells, per greenlet, whether the connection the last request took
was a pooled one, and hands a fresh one on demand. It wraps geventhttpclient's
``ConnectionPool`` (``get_socket``, ``_create_socket``), which has no hook for either.
"""

from __future__ import annotations

from contextlib import contextmanager

import gevent.local


class ReuseWatch:
    def __init__(self, pool) -> None:
        self._local = gevent.local.local()
        local = self._local
        get, create = pool.get_socket, pool._create_socket

        def create_socket():
            local.reused = False
            return create()

        def get_socket():
            local.reused = True  # until the pool creates one
            if getattr(local, "fresh", False):
                pool._semaphore.acquire()  # what get_socket holds per socket handed out
                try:
                    return create_socket()
                except BaseException:
                    pool._semaphore.release()
                    raise
            return get()

        pool._create_socket = create_socket
        pool.get_socket = get_socket

    @property
    def reused(self) -> bool:
        """Whether this greenlet's last request went out on a pooled connection."""
        return getattr(self._local, "reused", False)

    @contextmanager
    def fresh(self, on: bool = True):
        """Requests of this greenlet inside take a new connection (when ``on``)."""
        self._local.fresh = on
        try:
            yield
        finally:
            self._local.fresh = False
