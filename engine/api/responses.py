"""The OpenAI response objects: a non-streamed completion or chat completion (one choice
per :class:`ChoiceResult`, usage summed over them), and the server-sent events of a
streamed one (:class:`ChunkWriter`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.api.errors import ApiError
from engine.api.json_codec import dumps


def usage(num_prompt: int, num_completion: int, num_cached: int | None = None) -> dict:
    """OpenAI's usage object; with ``num_cached`` (a request's final usage), its
    ``prompt_tokens_details.cached_tokens``: prompt tokens found in the prefix cache (as
    OpenAI and vLLM report them)."""
    out: dict = {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }
    if num_cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": num_cached}
    return out


@dataclass
class ChoiceResult:
    """What one choice of a non-streamed response says."""

    text: str
    finish_reason: str
    num_prompt_tokens: int
    num_completion_tokens: int
    num_cached_tokens: int = 0


def _usage_of(results: list[ChoiceResult]) -> dict:
    return usage(
        sum(r.num_prompt_tokens for r in results),
        sum(r.num_completion_tokens for r in results),
        sum(r.num_cached_tokens for r in results),
    )


def completion_response(request_id: str, model: str, results: list[ChoiceResult]) -> dict:
    """A text_completion with one choice per result (index = position); usage sums them."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
            for i, r in enumerate(results)
        ],
        "usage": _usage_of(results),
    }


def chat_response(request_id: str, model: str, results: list[ChoiceResult]) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": r.text},
                "logprobs": None,
                "finish_reason": r.finish_reason,
            }
            for i, r in enumerate(results)
        ],
        "usage": _usage_of(results),
    }


class ChunkWriter:
    """Builds the server-sent events of one streamed request (OpenAI's byte format:
    ``data: {json}\\n\\n`` per chunk, ``data: [DONE]\\n\\n`` at the end).

    ``index`` is the choice a chunk belongs to (a batched completion request streams
    its prompts interleaved). With ``continuous_usage`` (vLLM's
    ``stream_options.continuous_usage_stats``, honoured with ``include_usage``) every
    chunk carries its choice's usage so far; otherwise ``usage`` is null until the
    final usage-only chunk."""

    DONE = b"data: [DONE]\n\n"

    def __init__(
        self,
        request_id: str,
        model: str,
        kind: str,
        include_usage: bool,
        continuous_usage: bool = False,
    ) -> None:
        self.kind = kind
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        # Every chunk shares these leading fields; precomputed once per request.
        self._head = (
            f'{{"id":{dumps(request_id)},"object":"{obj}","created":'
            f'{int(time.time())},"model":{dumps(model)},'
        )
        self._tail = ',"usage":null}' if include_usage else "}"

    def _event(self, choice: str, counts: tuple[int, int] | None) -> bytes:
        tail = self._tail
        if self.continuous_usage and counts is not None:
            tail = f',"usage":{dumps(usage(*counts))}}}'
        return f'data: {self._head}"choices":[{choice}]{tail}\n\n'.encode()

    def role(self, index: int = 0, counts: tuple[int, int] | None = None) -> bytes:
        """The first chat chunk: the assistant role, no content yet."""
        return self._event(
            f'{{"index":{index},"delta":{{"role":"assistant","content":""}},'
            '"logprobs":null,"finish_reason":null}',
            counts,
        )

    def text(self, delta: str, index: int = 0, counts: tuple[int, int] | None = None) -> bytes:
        """A text delta; ``counts`` is (prompt tokens, completion tokens so far)."""
        if self.kind == "chat":
            return self._event(
                f'{{"index":{index},"delta":{{"content":{dumps(delta)}}},'
                '"logprobs":null,"finish_reason":null}',
                counts,
            )
        return self._event(
            f'{{"index":{index},"text":{dumps(delta)},"logprobs":null,"finish_reason":null}}',
            counts,
        )

    def finish(
        self, finish_reason: str, index: int = 0, counts: tuple[int, int] | None = None
    ) -> bytes:
        if self.kind == "chat":
            return self._event(
                f'{{"index":{index},"delta":{{}},"logprobs":null,'
                f'"finish_reason":"{finish_reason}"}}',
                counts,
            )
        return self._event(
            f'{{"index":{index},"text":"","logprobs":null,"finish_reason":"{finish_reason}"}}',
            counts,
        )

    def usage(self, num_prompt: int, num_completion: int, num_cached: int) -> bytes:
        """The final usage-only chunk (``num_cached``: the prompt tokens found in the
        prefix cache)."""
        return (
            f'data: {self._head}"choices":[],"usage":'
            f"{dumps(usage(num_prompt, num_completion, num_cached))}}}\n\n"
        ).encode()

    @staticmethod
    def error(err: ApiError) -> bytes:
        return f"data: {dumps(err.body())}\n\n".encode()
