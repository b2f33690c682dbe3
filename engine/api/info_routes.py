"""The routes that report on the server: ``GET /v1/models``, ``GET /health``,
``GET|POST /ping``, ``GET /load``, ``GET /metrics`` (Prometheus, from the engine's
registry: docs/metrics.md) and ``GET /version``. All but /v1/models stay open without
the API key, so load balancers and scrapers keep working."""

from __future__ import annotations

import os
import uuid

from aiohttp import web

from engine.api.json_codec import dumps
from engine.api.state import STATE, ServerState
from engine.serving.async_engine import EngineDeadError


async def models(request: web.Request) -> web.Response:
    """vLLM's model card: ``created`` is the server's start; ``root`` the model loaded."""
    state = request.app[STATE]
    name = state.settings.served_model_name
    body = {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": state.created,
                "owned_by": "schedscope",
                "root": state.engine.config.model,
                "parent": None,
                "max_model_len": state.context.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": state.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
    return web.Response(text=dumps(body), content_type="application/json")


def health_body(state: ServerState) -> dict:
    engine = state.engine
    stats = engine.stats
    without_progress_s = engine.seconds_without_progress()
    serving_state = _serving_state(state, without_progress_s)
    return {
        "status": "ok" if serving_state == "running" else "unavailable",
        "state": serving_state,
        "seconds_without_progress": (
            None if without_progress_s is None else round(without_progress_s, 3)
        ),
        "num_running": stats.num_running,
        "num_waiting": stats.num_waiting,
        "num_swapped": stats.num_swapped,
        "num_unfinished": stats.num_unfinished,
        "num_in_flight": engine.num_in_flight,
        "num_free_device_blocks": stats.num_free_device_blocks,
        "num_device_blocks": stats.num_device_blocks,
        "num_free_host_blocks": stats.num_free_host_blocks,
        "num_host_blocks": stats.num_host_blocks,
        "num_steps": stats.num_steps,
        "clock_epoch_unix": stats.clock_epoch_unix,
        "engine_time_s": engine.now(),
        "num_observer_errors": stats.num_observer_errors,
        "num_metrics_renders": engine.num_metrics_renders,
        "num_failed_requests": state.num_failed_requests,
        "num_open_connections": state.connections.num_open,
        "num_refused_connections": state.connections.num_refused,
        "num_evicted_connections": state.connections.num_evicted,
        "num_header_timeouts": state.connections.num_header_timeouts,
        "num_engine_errors": len(stats.errors),
        "last_engine_error": stats.errors[-1] if stats.errors else None,
        "faults": stats.faults,
        "cpus": _cpus(),
    }


def _cpus() -> list[int] | None:
    """The CPU ids this server may run on (its affinity); None where the platform does
    not say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _serving_state(state: ServerState, without_progress_s: float | None) -> str:
    """/health's ``state``: the engine's, unless it runs but the server drains, or it has
    had work and not stepped for longer than the liveness timeout ("stalled": hung, or
    stopped by a signal); only "running" is healthy."""
    engine_state = state.engine.state
    if engine_state != "running":
        return engine_state
    if state.draining:
        return "draining"
    timeout_s = state.settings.engine_liveness_timeout_s
    if timeout_s > 0 and without_progress_s is not None and without_progress_s > timeout_s:
        return "stalled"
    return "running"


def _healthy(state: ServerState) -> bool:
    return _serving_state(state, state.engine.seconds_without_progress()) == "running"


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(
        status=200 if _healthy(state) else 503,
        text=dumps(health_body(state)),
        content_type="application/json",
    )


async def ping(request: web.Request) -> web.Response:
    """vLLM's (and SageMaker's) ``/ping``: /health's status, no body."""
    return web.Response(status=200 if _healthy(request.app[STATE]) else 503)


async def load(request: web.Request) -> web.Response:
    """vLLM's ``/load``: the generation requests the server is serving now (validated,
    response not yet finished, streams included)."""
    body = {"server_load": len(request.app[STATE].in_flight)}
    return web.Response(text=dumps(body), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition of the engine's metrics: OpenMetrics (with exemplars) when
    the scraper's ``Accept`` asks for it, else the classic text format. Answered from the
    latest rendering, never by making the engine render (``render_metrics``): in process
    mode the engine process pushes it at most once per ``METRICS_INTERVAL_S`` while it
    works (and once as it goes idle), so a scrape is at most that stale and any number
    of scrapers costs the engine the same. A 503 when the engine has pushed no
    rendering of that format within ``metrics_timeout_s`` (or cannot render)."""
    state = request.app[STATE]
    try:
        rendered = await state.engine.render_metrics(
            request.headers.get("Accept"), state.settings.metrics_timeout_s
        )
    except TimeoutError:
        return web.Response(status=503, text="the engine did not answer in time\n")
    except (EngineDeadError, RuntimeError) as exc:
        return web.Response(status=503, text=f"metrics unavailable: {exc}\n")
    if rendered is None:
        return web.Response(status=404, text="this engine runs without metrics\n")
    body, content_type = rendered
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type  # with its version and charset params
    return response


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("schedscope")
    except PackageNotFoundError:
        return "0+unknown"


async def version(request: web.Request) -> web.Response:
    return web.Response(text=dumps({"version": _version()}), content_type="application/json")
