"""Serving as a process: :func:`run_server` serves until SIGINT or SIGTERM, then shuts
down gracefully; a second signal aborts every in-flight request at once. When the engine
can no longer serve (its process died), it shuts down too, and exits
:data:`EXIT_ENGINE_LOST`, so that a supervisor (systemd, Kubernetes) restarts it."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable

from aiohttp import web

from engine.api.lifecycle import ApiServer
from engine.api.serving_line import SERVING_LINE
from engine.api.state import ServerSettings
from engine.serving.async_engine import AsyncEngine

log = logging.getLogger("schedscope.server")

#: The exit code when the engine died, or had to be killed because it would not stop: the
#: server did not serve to the end, whatever the signals said (0: a clean shutdown).
EXIT_ENGINE_LOST = 1
#: After the engine died, how long in-flight responses may take to send their error
#: (they have it at once: this bounds only a slow client's writes).
ENGINE_LOST_FLUSH_S = 2.0


def run_server(
    async_engine: AsyncEngine,
    tokenizer,
    settings: ServerSettings,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
    announce: Callable[[str], None] | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; returns the exit code (0, or
    :data:`EXIT_ENGINE_LOST`). A second signal aborts every in-flight request at once.
    An engine that dies ends the serving as a signal would, without the drain."""
    return asyncio.run(_serve(async_engine, tokenizer, settings, extra_routes, announce))


async def _serve(async_engine, tokenizer, settings, extra_routes, announce) -> int:
    server = ApiServer(async_engine, tokenizer, settings, extra_routes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            log.warning(
                "second signal: aborting %d in-flight requests", len(server.state.in_flight)
            )
            server.abort_all()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        url = await server.start()
    except BaseException:
        await server.stop()  # the engine thread started with the app
        raise
    (announce or _print)(f"{SERVING_LINE}{url}")
    signalled = asyncio.ensure_future(stop.wait())
    lost = asyncio.ensure_future(async_engine.wait_lost())
    try:
        await asyncio.wait((signalled, lost), return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
        lost.cancel()
    if async_engine.failure is not None:
        # Every stream has been told; let the responses send it, then stop serving.
        log.error(
            "the engine can no longer serve (%s): shutting down, exit code %d, once the %d "
            "responses in flight have sent their error",
            async_engine.failure,
            EXIT_ENGINE_LOST,
            len(server.state.in_flight),
        )
        await server.wait_for_responses(ENGINE_LOST_FLUSH_S)
    else:
        log.warning(
            "shutting down: draining %d in-flight requests (up to %.1f s)",
            len(server.state.in_flight),
            settings.shutdown_timeout_s,
        )
    await server.stop()
    if async_engine.failure is not None:  # it died, or had to be killed while stopping
        return EXIT_ENGINE_LOST
    return 0


def _print(line: str) -> None:
    print(line, flush=True)
