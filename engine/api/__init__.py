"""The OpenAI-compatible HTTP API: request validation (``protocol``) and the aiohttp
server (``server``)."""

from engine.api.server import ApiServer, ServerSettings, create_app, run_server

__all__ = ["ApiServer", "ServerSettings", "create_app", "run_server"]
