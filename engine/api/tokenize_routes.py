"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: the server's own token counts.

``/tokenize`` takes vLLM's completion form ``{"prompt": str}`` or chat form
``{"messages": [...]}`` and answers ``{"count", "max_model_len", "tokens",
"token_strs"}``; the chat form goes through the same message validation and chat
template as ``/v1/chat/completions``, so ``count`` is the ``usage.prompt_tokens`` that
request would report. ``/detokenize`` takes ``{"tokens": [ids]}`` and answers
``{"prompt": text}``. ``model`` is optional (vLLM); when sent it must be the served
model (else 404, as on the generation routes). Unknown fields are ignored.

Both cost the server CPU and nothing else (no engine queue bounds them), and answer
more bytes than they are sent, so they have limits of their own
(:class:`TokenizeLimits`): a smaller body limit than the generation routes' (413), and
a bound on the tokens of one request (400 naming it), checked by the tokenizer's cheap
lower bound before tokenizing when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine.api.body import read_json_body
from engine.api.chat_template import chat_messages, render_chat
from engine.api.connections import client_of
from engine.api.errors import ApiError, bad_request
from engine.api.generate_request import ServingContext
from engine.api.heavy_work import HeavyWork
from engine.api.json_codec import check_text, dumps, parse_json_object
from engine.api.validation import check_model


@dataclass(frozen=True)
class TokenizeLimits:
    max_body_bytes: int  # a larger body is a 413
    max_tokens: int  # tokens /tokenize answers, or /detokenize decodes, at most
    offload_parse_bytes: int  # larger bodies are served on a worker thread


def add_tokenize_routes(
    app: web.Application,
    context: ServingContext,
    limits: TokenizeLimits,
    body_timeout_s: float,
    heavy_work: HeavyWork,
) -> None:
    """Add ``POST /tokenize`` and ``POST /detokenize`` to ``app``. Bodies are read as
    the generation routes read theirs (engine.api.body: JSON only, bounded inflation, a
    deadline) under ``limits.max_body_bytes``; one larger than
    ``limits.offload_parse_bytes`` is parsed, validated, tokenized and its response
    encoded on a worker thread (heavy_work), so neither a long prompt nor its long
    answer stalls the event loop."""

    def respond(raw: bytes, parse) -> bytes:
        # The response is encoded where the body is parsed: encoding 10 MB of JSON costs
        # the event loop as much as parsing it.
        return dumps(parse(parse_json_object(raw), context, limits.max_tokens)).encode()

    async def run(request: web.Request, parse) -> web.Response:
        raw = await read_json_body(
            request, limits.max_body_bytes, body_timeout_s, "--max-tokenize-body-bytes"
        )
        if len(raw) > limits.offload_parse_bytes:
            body = await heavy_work.run(
                respond, raw, parse, client=client_of(request), cost=len(raw)
            )
        else:  # a small body's answer is small too: at most about a token per byte
            body = respond(raw, parse)
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    async def tokenize(request: web.Request) -> web.Response:
        return await run(request, tokenize_body)

    async def detokenize(request: web.Request) -> web.Response:
        return await run(request, detokenize_body)

    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)


def too_many_tokens(count: int, limit: int, param: str, at_least: bool = False) -> ApiError:
    return bad_request(
        f"{param} is {'at least ' if at_least else ''}{count} tokens; this server "
        f"tokenizes at most {limit} tokens in one request (--max-tokenize-tokens)",
        param,
        "too_many_tokens",
    )


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


def tokenize_body(body: dict, ctx: ServingContext, max_tokens: int) -> dict[str, Any]:
    """The response to a ``/tokenize`` body (an :class:`ApiError` for a bad one, or for
    a text of more than ``max_tokens`` tokens)."""
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
        param = "messages"
    elif has_prompt:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string (token ids need no tokenizing)", "prompt")
        text = check_text(prompt, "prompt")
        param = "prompt"
    else:
        raise bad_request("missing required field: prompt (or messages, the chat form)", "prompt")
    bound = getattr(ctx.tokenizer, "num_tokens_lower_bound", None)
    if bound is not None and (at_least := bound(text)) > max_tokens:
        raise too_many_tokens(at_least, max_tokens, param, at_least=True)  # never tokenized
    tokens = ctx.tokenizer.encode(text)
    if len(tokens) > max_tokens:
        raise too_many_tokens(len(tokens), max_tokens, param)
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


def detokenize_body(body: dict, ctx: ServingContext, max_tokens: int) -> dict[str, Any]:
    """The response to a ``/detokenize`` body (of at most ``max_tokens`` ids). Special
    tokens are kept in the text (vLLM decodes with ``skip_special_tokens=False``
    here)."""
    _optional_model(body, ctx)
    tokens = body.get("tokens")
    if tokens is None:
        raise bad_request("missing required field: tokens", "tokens")
    if isinstance(tokens, list) and len(tokens) > max_tokens:
        raise too_many_tokens(len(tokens), max_tokens, "tokens")
    vocab = ctx.tokenizer.vocab_size
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
    ):
        raise bad_request(
            f"tokens must be an array of token ids (integers in [0, {vocab}))", "tokens"
        )
    return {"prompt": ctx.tokenizer.decode(tokens, skip_special_tokens=False)}
