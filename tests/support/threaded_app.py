"""An aiohttp application served on 127.0.0.1 from a thread of the test process: the base
of the tests' fake OpenAI-compatible targets (``vllm_stub``, ``hostile_target``).

A subclass adds its routes in :meth:`ThreadedApp.add_routes`; ``with Subclass(...) as
app:`` serves it on a free port (``app.url``) until the block ends.
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ThreadedApp:
    #: What the error says when the app does not start.
    name = "the test server"
    #: Seconds aiohttp waits for open responses at the end.
    shutdown_timeout_s = 60.0

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def on_stop(self) -> None:
        """Called after the server stopped (a subclass's own clean-up)."""

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        app = web.Application()
        self.add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout_s)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self):
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self.name} did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.on_stop()
