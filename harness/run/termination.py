"""SIGTERM as an orderly stop of ``schedscope run``.

Python's default SIGTERM ends the process at once: no ``finally``, no ExitStack, so the
servers, Locust processes and Prometheus a run started kept running after it (a CI job
that is cancelled sends SIGTERM). Inside :func:`sigterm_stops_the_run`, SIGTERM raises
:class:`SystemExit` (143, the shell's 128 + 15) in the main thread instead, so every
cell's ExitStack stops what it started, the way Ctrl-C does.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_TERMINATED = 128 + signal.SIGTERM


def _raise_exit(signum, frame) -> None:
    # Once: a second SIGTERM (runners send several) must not cut the cleanup short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(EXIT_TERMINATED)


@contextmanager
def sigterm_stops_the_run() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; nothing to install here
        return
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
