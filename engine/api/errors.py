"""Errors of the HTTP API: :class:`ApiError`, a request that cannot be served, rendered
as an OpenAI error body (``{"error": {"message", "type", "param", "code"}}``), and builders
of the common kinds (a 400 naming the field, a 503)."""

from __future__ import annotations


class ApiError(Exception):
    """A request that cannot be served; rendered as an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, "server_error", None, "service_unavailable")
