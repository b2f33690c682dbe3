"""What every part of the server shares: its :class:`ServerSettings`, the per-app
:class:`ServerState` (the engine, the tokenizer, the requests in flight, draining) and
the app key :data:`STATE` under which handlers find it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from aiohttp import web

from engine.api.connections import ConnectionGuard
from engine.api.generate_request import ServingContext
from engine.api.heavy_work import HeavyWork
from engine.serving.async_engine import AsyncEngine
from engine.serving.tokenizer import Tokenizer


class ServerSettingsError(ValueError):
    """A server setting out of its range; ``field`` names it (the CLI names its flag)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def _setting(default, help: str, flag: str | None = "", **extra):  # noqa: A002
    """A field of :class:`ServerSettings` with what its ``schedscope serve`` flag says:
    ``flag`` "" is ``--`` + the name with dashes, None no flag (an internal setting)."""
    return field(default=default, metadata={"help": help, "flag": flag, **extra})


@dataclass(frozen=True)
class ServerSettings:
    """How the HTTP server serves: what it binds, who may call it, and its limits. Each
    field with a flag is a ``schedscope serve`` option generated from this metadata
    (harness/serve/server_flags.py), so a limit's default and meaning live here only."""

    served_model_name: str = _setting(
        "tiny", "The model name clients send; default: --model.", flag=None
    )
    host: str = _setting("127.0.0.1", "Address to bind.")
    port: int = _setting(8000, "Port to bind; 0 picks a free one.")
    api_key: str | None = _setting(
        None,
        "Require 'Authorization: Bearer KEY' on /v1/* routes.",
        envvar="SCHEDSCOPE_API_KEY",
    )
    max_body_bytes: int = _setting(
        1 << 20, "Larger request bodies (compressed or inflated) get 413."
    )
    shutdown_timeout_s: float = _setting(
        10.0, "On SIGINT/SIGTERM, in-flight requests may finish for this long; then aborted."
    )
    retry_after_s: int = _setting(1, "The Retry-After of a 429.", flag=None)
    header_timeout_s: float = _setting(
        10.0,
        "Seconds from a connection's opening, or the end of its last response, until the "
        "next request's headers are complete; then 408 and close (slow-client protection; "
        "also the keep-alive timeout).",
        flag="--header-timeout",
    )
    body_timeout_s: float = _setting(
        30.0, "Seconds a request's body may take to arrive; then 408.", flag="--body-timeout"
    )
    max_connections: int = _setting(
        1024,
        "Open connections at most; at the cap the longest-idle one is closed for a new one, "
        "or, none idle, the new one gets a 503. Lowered to fit the open-file limit.",
    )
    # Connections from the server's own address (a load generator on the same machine)
    # are not limited (engine.api.connections).
    max_connections_per_client: int | None = _setting(
        None,
        "Open connections of one client (peer address; an IPv6 /64) at most; at its cap its "
        "own longest-idle one is closed for a new one, or, none idle, the new one gets a "
        "429. Connections from the server's own address (this machine) are not limited. "
        "Default: half of --max-connections.",
    )
    max_tokenize_body_bytes: int = _setting(
        256 * 1024, "Larger /tokenize and /detokenize bodies get 413."
    )
    max_tokenize_tokens: int = _setting(
        131072,
        "/tokenize answers at most this many tokens, /detokenize decodes at most this "
        "many; more is a 400 naming the limit.",
    )
    metrics: bool = _setting(
        True,
        "Serve Prometheus metrics on GET /metrics (vLLM's names and schedscope_*; "
        "docs/metrics.md); --no-metrics: no registry, no observer, no route.",
    )
    metrics_timeout_s: float = _setting(
        5.0, "How long /metrics waits for the engine process.", flag=None
    )
    engine_liveness_timeout_s: float = _setting(
        30.0,
        "/health answers 503 'stalled' when the engine has had work and not stepped for "
        "longer than this (hung, or stopped); long enough for a legitimate long step on a "
        "slow CPU. 0: no deadline.",
    )

    def validate(self) -> None:
        """Raise :class:`ServerSettingsError` for the first setting out of its range."""
        if not 0 <= self.port <= 65535:
            raise ServerSettingsError("port", f"must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ServerSettingsError("api_key", "must not be empty")
        if not self.shutdown_timeout_s >= 0:
            raise ServerSettingsError(
                "shutdown_timeout_s", f"must be >= 0, got {self.shutdown_timeout_s}"
            )
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ServerSettingsError(name, f"must be a number of seconds > 0, got {value}")
        live = self.engine_liveness_timeout_s
        if not (live >= 0 and math.isfinite(live)):
            raise ServerSettingsError(
                "engine_liveness_timeout_s",
                f"must be a number of seconds >= 0 (0: no deadline), got {live}",
            )
        for name in (
            "max_body_bytes",
            "max_connections",
            "max_connections_per_client",
            "max_tokenize_body_bytes",
            "max_tokenize_tokens",
        ):
            count = getattr(self, name)
            if count is not None and count < 1:
                raise ServerSettingsError(name, f"must be >= 1, got {count}")


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
