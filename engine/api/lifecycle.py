"""The server's lifecycle: :class:`ApiServer` puts the app on a TCP site and stops it
gracefully (drain, then stop)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiohttp import web

from engine.api.app import create_app
from engine.api.connections import GuardedTCPSite
from engine.api.state import STATE, ServerSettings, ServerState
from engine.serving.async_engine import AsyncEngine


class ApiServer:
    """The app on a TCP site, and the drain-then-stop sequence of a graceful shutdown."""

    def __init__(
        self,
        async_engine: AsyncEngine,
        tokenizer,
        settings: ServerSettings,
        extra_routes: Iterable[web.AbstractRouteDef] = (),
    ) -> None:
        self.settings = settings
        self.engine = async_engine
        self.app = create_app(async_engine, tokenizer, settings, extra_routes)
        # After the engine drained, handlers only have their last bytes to write.
        self.runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        self.url: str | None = None

    @property
    def state(self) -> ServerState:
        return self.app[STATE]

    async def start(self) -> str:
        """Bind and serve; returns the bound URL (``--port 0`` picks a free port)."""
        guard = self.state.connections
        asyncio.get_running_loop().set_exception_handler(guard.loop_exception_handler)
        await self.runner.setup()
        site = GuardedTCPSite(
            self.runner,
            self.settings.host,
            self.settings.port,
            guard,
            access_log=None,
            # Bodies are inflated by engine.api.body, bounded, after authentication.
            # Idle keep-alive connections end at the header deadline (connections.py);
            # aiohttp's own keep-alive timer is only a backstop.
            auto_decompress=False,
            keepalive_timeout=max(75.0, 2 * self.settings.header_timeout_s),
            # A body left unread after an early error is drained for at most this long.
            lingering_time=2.0,
        )
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.url

    async def wait_for_responses(self, timeout_s: float) -> None:
        """Wait until no request is being served, for up to ``timeout_s``."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.state.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Refuse new requests (503), let in-flight ones finish for up to
        ``shutdown_timeout_s``, abort the rest, then close the listener."""
        self.state.draining = True
        await self.engine.shutdown(self.settings.shutdown_timeout_s)
        await self.runner.cleanup()

    def abort_all(self) -> None:
        for request_id in list(self.state.in_flight):
            self.engine.abort(request_id)
