"""What a choice's engine outputs mean for its response, streamed or not: the generated
tokens whose text is returned, and the error of a request that ended without stop or
length."""

from __future__ import annotations

from engine.api.errors import ApiError, unavailable
from engine.api.generate_request import GenerateRequest
from engine.api.state import ServerState
from engine.serving.async_engine import RequestOutput


def end_error(state: ServerState, out: RequestOutput) -> ApiError:
    """The error for a request that ended without stop/length."""
    if out.finish_reason == "error":
        state.num_failed_requests += 1
        return ApiError(
            500,
            f"the engine failed while running this request: {out.error}",
            "server_error",
            None,
            "engine_error",
        )
    if state.draining or not state.engine.is_accepting:
        return unavailable("the request was aborted: the server is shutting down")
    return unavailable(f"the request ended early ({out.finish_reason})")


def cached_tokens(out: RequestOutput) -> int:
    """The prompt tokens a request found in the prefix cache, from its last output (the
    one that carries its final state)."""
    return getattr(out.sequence, "num_cached_tokens", 0) or 0


def text_ids(req: GenerateRequest, token_ids: list[int], num_generated: int) -> list[int]:
    """The generated tokens whose text is returned: a final stop-string token is not
    (OpenAI leaves stop sequences out of the text)."""
    if (
        token_ids
        and token_ids[-1] in req.stop_string_token_ids
        and num_generated >= req.params.min_tokens
    ):
        return token_ids[:-1]
    return token_ids
