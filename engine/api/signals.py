"""Serving as a process: :func:`run_server` serves until SIGINT or SIGTERM, then shuts
down gracefully; a second signal aborts every in-flight request at once."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable

from aiohttp import web

from engine.api.lifecycle import ApiServer
from engine.api.state import ServerSettings
from engine.serving.async_engine import AsyncEngine

log = logging.getLogger("schedscope.server")


def run_server(
    async_engine: AsyncEngine,
    tokenizer,
    settings: ServerSettings,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
    announce: Callable[[str], None] | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; returns the exit code.
    A second signal aborts every in-flight request at once."""
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
    (announce or _print)(f"schedscope serving on {url}")
    await stop.wait()
    log.warning(
        "shutting down: draining %d in-flight requests (up to %.1f s)",
        len(server.state.in_flight),
        settings.shutdown_timeout_s,
    )
    await server.stop()
    return 0


def _print(line: str) -> None:
    print(line, flush=True)
