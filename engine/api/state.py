"""What every part of the server shares: its :class:`ServerSettings`, the per-app
:class:`ServerState` (the engine, the tokenizer, the requests in flight, draining) and
the app key :data:`STATE` under which handlers find it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import web

from engine.api.connections import ConnectionGuard
from engine.api.generate_request import ServingContext
from engine.api.heavy_work import HeavyWork
from engine.serving.async_engine import AsyncEngine
from engine.serving.tokenizer import Tokenizer


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    api_key: str | None = None  # "Authorization: Bearer KEY" on /v1/* and GUARDED_PATHS
    max_body_bytes: int = 1 << 20  # compressed or inflated: a larger body is a 413
    shutdown_timeout_s: float = 10.0  # in-flight requests may finish for this long
    retry_after_s: int = 1  # the Retry-After of a 429
    header_timeout_s: float = 10.0  # a request's headers must arrive within this
    body_timeout_s: float = 30.0  # and its body within this, once its headers are in
    max_connections: int = 1024  # open connections; more are refused with a 503
    # open connections of one client (peer address) at most; more are refused with a
    # 429. None: half of max_connections. Connections from the server's own address
    # (a load generator on the same machine) are not limited (engine.api.connections).
    max_connections_per_client: int | None = None
    max_tokenize_body_bytes: int = 256 * 1024  # /tokenize and /detokenize bodies
    max_tokenize_tokens: int = 131072  # tokens /tokenize answers, /detokenize decodes
    metrics: bool = True  # GET /metrics (open without the API key, like /health)
    metrics_timeout_s: float = 5.0  # how long /metrics waits for the engine process
    #: /health says "stalled" (503) when the engine has had work and not stepped for
    #: longer than this; 0: never
    engine_liveness_timeout_s: float = 30.0


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: Tokenizer
    settings: ServerSettings
    context: ServingContext
    connections: ConnectionGuard
    draining: bool = False
    in_flight: set[str] = field(default_factory=set)  # request ids being served
    num_failed_requests: int = 0  # ended with an engine error
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' created
    heavy_work: HeavyWork = field(default_factory=HeavyWork)  # large bodies, fairly


STATE = web.AppKey("schedscope_state", ServerState)
