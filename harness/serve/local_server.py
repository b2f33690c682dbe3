"""Live servers on loopback for tests, benchmarks and notebooks (the harness side: the
engine ships no test fixtures).

- :class:`BackgroundServer`: the app on a background thread (its own event loop), for
  synchronous clients such as the official ``openai`` package::

      with BackgroundServer(sim_engine(), HashTokenizer(4096)) as server:
          client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")

- :class:`CliServer`: ``schedscope serve`` as a subprocess (signals, exit codes).
- :class:`HttpClient`: raw keep-alive HTTP requests (any bytes, any headers).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

import harness
from engine.api.server import ApiServer, ServerSettings, health_body
from engine.api.serving_line import serving_url
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.clock import WallClock
from engine.core.cost_model import CostModel
from engine.factory import build_simulated_engine
from engine.llm_engine import LLMEngine
from engine.serving.async_engine import AsyncEngine
from harness.processes.stop import stop_process


def constant_step_cost(step_s: float) -> CostModel:
    """Every non-empty step takes ``step_s`` (0: as fast as Python goes)."""
    return CostModel.constant(step_s)


def sim_engine(
    step_s: float = 0.0,
    num_device_blocks: int = 4096,
    num_host_blocks: int = 256,
    block_size: int = 16,
    **scheduler_knobs,
) -> LLMEngine:
    """A simulated engine on the wall clock with fixed pool sizes."""
    config = EngineConfig(
        SchedulerConfig(**scheduler_knobs),
        CacheConfig(
            block_size=block_size,
            num_gpu_blocks_override=num_device_blocks,
            num_cpu_blocks_override=num_host_blocks,
        ),
    )
    return build_simulated_engine(config, constant_step_cost(step_s), clock=WallClock())


class BackgroundServer:
    """Starts on ``__enter__`` (bound to 127.0.0.1, a free port), drains and stops on
    ``__exit__``; ``url`` is the base URL."""

    def __init__(
        self,
        engine: LLMEngine,
        tokenizer,
        settings: ServerSettings | None = None,
        extra_routes: Iterable[web.AbstractRouteDef] = (),
    ) -> None:
        self.settings = settings or ServerSettings(host="127.0.0.1", port=0, shutdown_timeout_s=2.0)
        self.async_engine = AsyncEngine(engine)
        self._tokenizer = tokenizer
        self._extra_routes = list(extra_routes)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="schedscope-server", daemon=True
        )
        self.server: ApiServer | None = None
        self.url = ""

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        self.url = self.call(self._start(), timeout=30)
        return self

    async def _start(self) -> str:
        self.server = ApiServer(
            self.async_engine, self._tokenizer, self.settings, self._extra_routes
        )
        return await self.server.start()

    def _started(self) -> ApiServer:
        assert self.server is not None, "__enter__ first"
        return self.server

    def call(self, coro, timeout: float = 60):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def health(self) -> dict:
        """The /health body, read directly (no HTTP)."""

        async def read() -> dict:
            return health_body(self._started().state)

        return self.call(read(), timeout=10)

    def __exit__(self, *exc) -> None:
        try:
            self.call(self._started().stop(), timeout=self.settings.shutdown_timeout_s + 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


class HttpClient:
    """A minimal keep-alive HTTP/1.1 client (``http.client``) for raw requests: any bytes
    as the body, any headers; reconnects once if the server closed the connection."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"no host in {url!r}")
        self.host, self.port, self.timeout = parts.hostname, parts.port, timeout
        self._conn: http.client.HTTPConnection | None = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            conn = self._conn
            try:
                conn.request(method, path, body=body, headers=headers or {})
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine):
                self.close()
                if attempt:
                    raise
                continue
            if response.will_close:
                self.close()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data
        raise AssertionError("unreachable")

    def post_json(self, path: str, body, headers: dict[str, str] | None = None):
        return self.request(
            "POST",
            path,
            json.dumps(body).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class CliServer:
    """``schedscope serve ARGS --port 0`` in a subprocess (``python -m harness.cli``):
    ``url`` is parsed from its start-up line; on exit it gets SIGTERM, then SIGKILL if it
    has not ended within ``stop_timeout_s``. Its output goes to a temporary file (a full
    pipe would block it), readable as ``output()``."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        cpus: tuple[int, ...] | None = None,
    ) -> None:
        """``cpus``: pin the server to these CPU ids as it starts (None: not pinned;
        harness/processes/cpu_split.py)."""
        self.args = args
        self.env = env
        self.cpus = cpus
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> CliServer:
        self._log = tempfile.NamedTemporaryFile(prefix="schedscope-serve-", suffix=".log")
        # the folder that holds the harness package (a checkout or site-packages): the
        # child imports this very copy of schedscope
        root = Path(harness.__file__).resolve().parents[1]
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        process = self.process = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "serve", "--port", "0", *self.args],
            cwd=root,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if self.cpus:
            from harness.processes.cpu_split import pin

            pin(process.pid, self.cpus)
        deadline = time.monotonic() + self.start_timeout_s
        while not self.url:
            self.url = serving_url(self.output()) or ""
            if process.poll() is not None and not self.url:
                raise RuntimeError(f"server exited with {process.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                # read before stopping: __exit__ removes the log
                output = self.output()
                self.__exit__()
                raise TimeoutError(
                    f"server did not start within {self.start_timeout_s} s:\n{output}"
                )
            time.sleep(0.05)
        return self

    def output(self) -> str:
        with open(self._log.name, errors="replace") as f:
            return f.read()

    def _started(self) -> subprocess.Popen:
        assert self.process is not None, "__enter__ first"
        return self.process

    def terminate(self) -> None:
        self._started().send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self._started().wait(timeout)

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            stop_process(self.process, self.stop_timeout_s)
        self._log.close()
