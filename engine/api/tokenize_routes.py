"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: the server's own token counts.

``/tokenize`` takes vLLM's completion form ``{"prompt": str}`` or chat form
``{"messages": [...]}`` and answers ``{"count", "max_model_len", "tokens",
"token_strs"}``; the chat form goes through the same message validation and chat
template as ``/v1/chat/completions``, so ``count`` is the ``usage.prompt_tokens`` that
request would report. ``/detokenize`` takes ``{"tokens": [ids]}`` and answers
``{"prompt": text}``. ``model`` is optional (vLLM); when sent it must be the served
model (else 404, as on the generation routes). Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engine.api.body import HeavyWork, read_json_body
from engine.api.chat_template import chat_messages, render_chat
from engine.api.errors import bad_request
from engine.api.generate_request import ServingContext
from engine.api.json_codec import check_text, dumps, parse_json_object
from engine.api.validation import check_model


def add_tokenize_routes(
    app: web.Application,
    context: ServingContext,
    offload_parse_bytes: int,
    max_body_bytes: int,
    body_timeout_s: float,
    heavy_work: HeavyWork,
) -> None:
    """Add ``POST /tokenize`` and ``POST /detokenize`` to ``app``. Bodies are read as
    the generation routes read theirs (engine.api.body: JSON only, bounded inflation, a
    deadline); one larger than ``offload_parse_bytes`` is parsed, validated and
    tokenized on a worker thread, so a long prompt does not stall the event loop."""

    def parse_raw(raw: bytes, parse) -> dict:
        return parse(parse_json_object(raw), context)

    async def run(request: web.Request, parse) -> web.Response:
        raw = await read_json_body(request, max_body_bytes, body_timeout_s)
        if len(raw) > offload_parse_bytes:
            result = await heavy_work.run(parse_raw, raw, parse)
        else:
            result = parse_raw(raw, parse)
        return web.Response(text=dumps(result), content_type="application/json")

    async def tokenize(request: web.Request) -> web.Response:
        return await run(request, tokenize_body)

    async def detokenize(request: web.Request) -> web.Response:
        return await run(request, detokenize_body)

    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean (true or false)", name)
    return value


def _optional_model(body: dict, ctx: ServingContext) -> None:
    if body.get("model") is not None:
        check_model(body, ctx)


def tokenize_body(body: dict, ctx: ServingContext) -> dict[str, Any]:
    """The response to a ``/tokenize`` body (an :class:`ApiError` for a bad one)."""
    _optional_model(body, ctx)
    has_prompt = body.get("prompt") is not None
    has_messages = body.get("messages") is not None
    if has_prompt and has_messages:
        raise bad_request("send either prompt or messages, not both", "messages")
    # add_special_tokens is validated and has no effect: this server's tokenizers add no
    # special tokens, on this route as on the generation routes, so counts agree.
    _flag(body, "add_special_tokens", not has_messages)
    if has_messages:
        add_generation_prompt = _flag(body, "add_generation_prompt", True)
        if _flag(body, "continue_final_message", False):
            if add_generation_prompt and body.get("add_generation_prompt") is not None:
                raise bad_request(
                    "cannot set both continue_final_message and add_generation_prompt to true",
                    "continue_final_message",
                )
            add_generation_prompt = False  # the template closes no message: leave it open
        for name, neutral in (("chat_template", None), ("tools", [])):
            if body.get(name) not in (None, neutral):
                raise bad_request(
                    f"{name} is not supported by this server: it renders "
                    "every chat with its own template",
                    name,
                )
        text = render_chat(chat_messages(body), add_generation_prompt)
    elif has_prompt:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string (token ids need no tokenizing)", "prompt")
        text = check_text(prompt, "prompt")
    else:
        raise bad_request("missing required field: prompt (or messages, the chat form)", "prompt")
    tokens = ctx.tokenizer.encode(text)
    token_strs = None
    if _flag(body, "return_token_strs", False):
        pieces = getattr(ctx.tokenizer, "tokenize", None)
        token_strs = (
            pieces(text) if pieces is not None else [ctx.tokenizer.decode([t]) for t in tokens]
        )
    return {
        "count": len(tokens),
        "max_model_len": ctx.max_model_len,
        "tokens": tokens,
        "token_strs": token_strs,
    }


def detokenize_body(body: dict, ctx: ServingContext) -> dict[str, Any]:
    """The response to a ``/detokenize`` body. Special tokens are kept in the text
    (vLLM decodes with ``skip_special_tokens=False`` here)."""
    _optional_model(body, ctx)
    tokens = body.get("tokens")
    if tokens is None:
        raise bad_request("missing required field: tokens", "tokens")
    vocab = ctx.tokenizer.vocab_size
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
    ):
        raise bad_request(
            f"tokens must be an array of token ids (integers in [0, {vocab}))", "tokens"
        )
    return {"prompt": ctx.tokenizer.decode(tokens, skip_special_tokens=False)}
