"""The OpenAI-compatible HTTP server (aiohttp) in front of an :class:`AsyncEngine`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``POST /tokenize``, ``POST /detokenize`` (engine/api/tokenize_routes.py), ``GET /health``,
``GET|POST /ping``, ``GET /load``, ``GET /version``, ``GET /metrics`` (Prometheus, from
the engine's registry: docs/metrics.md; off with ``ServerSettings(metrics=False)``); more
via ``create_app(extra_routes=)``.

Each concept has its own module; this one re-exports them:

- ``engine.api.state``: :class:`ServerSettings`, the per-app :class:`ServerState`;
- ``engine.api.app``: :func:`create_app`, the application and its routes;
- ``engine.api.lifecycle``: :class:`ApiServer`, start and graceful stop;
- ``engine.api.signals``: :func:`run_server`, serving until SIGINT/SIGTERM;
- ``engine.api.middleware``: error bodies, the API key and draining guard;
- ``engine.api.generation``: the completion and chat routes, up to the first output;
- ``engine.api.heavy_work``: the budget of large bodies' parsing, handed out fairly;
- ``engine.api.connections``: the header deadline, the connection caps, HTTP framing;
- ``engine.api.request_identity``: a request's id, class and trace context (headers);
- ``engine.api.non_streamed`` and ``engine.api.streaming``: the two kinds of response;
- ``engine.api.engine_outputs``: what a choice's engine outputs mean for either;
- ``engine.api.info_routes``: /v1/models, /health, /ping, /load, /metrics, /version.
"""

from engine.api.app import RESERVED_FDS, connection_cap, create_app
from engine.api.generation import OFFLOAD_PARSE_BYTES, chat_completions, completions
from engine.api.info_routes import health, health_body, load, metrics, models, ping, version
from engine.api.lifecycle import ApiServer
from engine.api.middleware import GUARDED_PATHS, error_response
from engine.api.request_identity import (
    REQUEST_CLASS_HEADER,
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
)
from engine.api.signals import run_server
from engine.api.state import STATE, ServerSettings, ServerState

__all__ = [
    "GUARDED_PATHS",
    "OFFLOAD_PARSE_BYTES",
    "REQUEST_CLASS_HEADER",
    "REQUEST_ID_HEADER",
    "RESERVED_FDS",
    "STATE",
    "TRACEPARENT_HEADER",
    "ApiServer",
    "ServerSettings",
    "ServerState",
    "chat_completions",
    "completions",
    "connection_cap",
    "create_app",
    "error_response",
    "health",
    "health_body",
    "load",
    "metrics",
    "models",
    "ping",
    "run_server",
    "version",
]
