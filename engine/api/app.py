"""The aiohttp application: its routes and middlewares, its state, and the engine started
with the app and shut down with it."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiohttp import web

from engine.api.connections import ConnectionGuard, ConnectionLimits
from engine.api.generate_request import ServingContext
from engine.api.generation import OFFLOAD_PARSE_BYTES, chat_completions, completions
from engine.api.info_routes import health, load, metrics, models, ping, version
from engine.api.middleware import error_middleware, guard_middleware
from engine.api.state import STATE, ServerSettings, ServerState
from engine.api.tokenize_routes import TokenizeLimits, add_tokenize_routes
from engine.serving.async_engine import AsyncEngine

log = logging.getLogger("schedscope.server")


def create_app(
    async_engine: AsyncEngine,
    tokenizer,
    settings: ServerSettings,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
) -> web.Application:
    """The aiohttp application. The engine is started on app startup (if it is not
    already) and shut down on cleanup. ``extra_routes`` (e.g. ``web.get("/metrics",
    handler)``) are added as they are; ``app[STATE]`` gives them the engine."""
    config = async_engine.config
    context = ServingContext(
        (settings.served_model_name,), config.scheduler.max_model_len, tokenizer
    )
    app = web.Application(
        # aiohttp's own bound on a body read: the largest route's (each route has its own).
        client_max_size=max(settings.max_body_bytes, settings.max_tokenize_body_bytes),
        middlewares=[error_middleware, guard_middleware],
    )
    limits = ConnectionLimits(
        settings.header_timeout_s,
        connection_cap(settings.max_connections),
        settings.retry_after_s,
        settings.max_connections_per_client,
    )
    app[STATE] = ServerState(async_engine, tokenizer, settings, context, ConnectionGuard(limits))
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    add_tokenize_routes(
        app,
        context,
        TokenizeLimits(
            settings.max_tokenize_body_bytes, settings.max_tokenize_tokens, OFFLOAD_PARSE_BYTES
        ),
        settings.body_timeout_s,
        app[STATE].heavy_work,
    )
    app.router.add_get("/health", health)
    app.router.add_get("/ping", ping)
    app.router.add_post("/ping", ping)
    app.router.add_get("/load", load)
    app.router.add_get("/version", version)
    if settings.metrics:
        app.router.add_get("/metrics", metrics)
    app.router.add_routes(list(extra_routes))
    app.on_startup.append(_start_engine)
    app.on_cleanup.append(_stop_engine)
    return app


#: File descriptors kept free of connections: the engine's pipes, record files, logs.
RESERVED_FDS = 64


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to what the process's descriptor limit allows (a
    server that runs out of descriptors cannot even refuse connections cleanly)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return max_connections
    if soft == resource.RLIM_INFINITY or soft - RESERVED_FDS >= max_connections:
        return max_connections
    cap = max(1, soft - RESERVED_FDS)
    log.warning(
        "--max-connections %d lowered to %d: the open-file limit is %d (ulimit -n)",
        max_connections,
        cap,
        soft,
    )
    return cap


async def _start_engine(app: web.Application) -> None:
    engine = app[STATE].engine
    if engine.state == "created":
        engine.start()
    _warn_if_pool_is_small(app[STATE])


def _warn_if_pool_is_small(state: ServerState) -> None:
    """A pool that cannot hold one request at the default max_tokens (the rest of the
    context) refuses every request that does not set max_tokens: say so at start-up."""
    config = state.engine.config
    pool_tokens = state.engine.stats.num_device_blocks * config.cache.block_size
    if 0 < pool_tokens < config.scheduler.max_model_len:
        log.warning(
            "the KV pool holds %d tokens, fewer than max_model_len %d: a request without "
            "max_tokens (which defaults to the rest of the context) is refused unless its "
            "prompt + max_tokens fits the pool; lower --max-model-len to %d or give the cache "
            "more memory",
            pool_tokens,
            config.scheduler.max_model_len,
            pool_tokens,
        )


async def _stop_engine(app: web.Application) -> None:
    state = app[STATE]
    state.draining = True
    await state.engine.shutdown(state.settings.shutdown_timeout_s)
