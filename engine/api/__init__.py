"""The OpenAI-compatible HTTP API: the wire format (``protocol``, which names the modules
of request validation, responses and streaming text) and the aiohttp server (``server``,
which names the modules of the app, its routes, middlewares and lifecycle)."""

from engine.api.server import ApiServer, ServerSettings, create_app, run_server

__all__ = ["ApiServer", "ServerSettings", "create_app", "run_server"]
