"""The OpenAI wire format: request validation, response and stream-chunk objects.

Validation is strict and explicit: every field is type-checked by hand (``True`` is an
``int`` in Python and is refused where a number is expected; NaN and infinities are
refused everywhere), every bound is checked, and every failure is an :class:`ApiError`
whose message names the field and what was wrong. A client mistake is always a 4xx.
Unknown keys are ignored (as vLLM does); known OpenAI features this server does not
implement are refused when set to anything but their neutral value.
"""

from __future__ import annotations

import json
import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.sampling_params import SamplingParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: Below this a temperature is treated as greedy (vLLM's epsilon): dividing logits by a
#: denormal temperature overflows.
GREEDY_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 1024
MAX_MESSAGES = 4096
#: At most this many prompts in one batched completion request.
MAX_BATCH_PROMPTS = 128
#: JSON nested deeper than this is refused (naming the field) before any field is read:
#: nothing this API accepts nests more than a few levels, and deep values cost
#: recursion wherever they are echoed.
MAX_JSON_DEPTH = 32
#: The largest float32: sampling runs in float32, so a temperature above it is infinite.
FLOAT32_MAX = 3.4028234663852886e38
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

#: Fields of the OpenAI API this server does not implement, with the values that mean
#: "not used" (accepted silently); anything else is a 400 naming the field.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
}


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


# -- JSON --------------------------------------------------------------------------------
def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict:
    """The request body as a dict, or a 400 that says what is wrong with it."""
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"request body is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        body = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise bad_request("request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # NaN/Infinity, or an integer literal too long to convert
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {_json_type(body)}")
    for name, value in body.items():
        if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH - 1:
            shown = name if isinstance(name, str) and len(name) <= 64 else "a field"
            raise bad_request(
                f"{shown} is nested more than {MAX_JSON_DEPTH - 1} levels deep",
                shown if shown != "a field" else None,
            )
    return body


def json_depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests (a scalar is 0, ``[1]`` is 1), counting no further
    than ``limit``; iterative, so no value can exhaust the recursion limit."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest >= limit:
                    return deepest
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def dumps(obj: Any) -> str:
    """Compact JSON, ASCII-only (safe for any string the client sent back to it)."""
    return json.dumps(obj, separators=(",", ":"))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _show(value: Any, limit: int = 40) -> str:
    """A short rendering of a client's value for an error message; never fails (a
    value nested too deeply to render is described, not rendered)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if json_depth(value, 8) >= 8:
        return f"(an {_json_type(value)} nested 8 or more levels deep)"
    text = dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- field readers ----------------------------------------------------------------------
def _int(body: dict, name: str, default: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(
            f"{name} must be an integer, got {_json_type(value)} {_show(value)}", name
        )
    if not lo <= value <= hi:
        bounds = f">= {lo}" if hi == INT64_MAX else f"in [{lo}, {hi}]"
        raise bad_request(f"{name} must be {bounds}, got {_show(value)}", name)
    return value


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{name} must be a number, got {_json_type(value)} {_show(value)}", name)
    value = float(value) if isinstance(value, float) or abs(value) < 2**1000 else math.inf
    if not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number", name)
    return value


def _as_float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean, got {_json_type(value)} {_show(value)}", name)
    return value


def check_text(value: str, name: str) -> str:
    """Refuse strings Python holds but UTF-8 cannot encode (lone surrogates from JSON)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{name} contains an unpaired UTF-16 surrogate", name) from None
    return value


# -- the validated request ----------------------------------------------------------------
@dataclass
class ServingContext:
    """What validation needs to know about the server."""

    served_model_names: tuple[str, ...]
    max_model_len: int
    tokenizer: Any  # engine.serving.tokenizer.Tokenizer


@dataclass
class PromptChoice:
    """One prompt of a request and its sampling parameters (a batched completion
    request has one per prompt; its ``choices`` carry the same indices)."""

    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class GenerateRequest:
    """A validated completion or chat request, ready for the engine."""

    kind: str  # "completion" | "chat"
    model: str
    choices: list[PromptChoice]
    priority: int = 0
    stream: bool = False
    include_usage: bool = False
    #: vLLM's ``stream_options.continuous_usage_stats``: usage on every chunk.
    continuous_usage: bool = False
    #: Token ids that came from ``stop`` strings: like OpenAI's stop sequences, their
    #: text is left out of the output.
    stop_string_token_ids: frozenset[int] = field(default_factory=frozenset)
    #: ``prompt`` was a list of prompts (even of one): the response is a batch.
    is_batch: bool = False
    #: The client set max_tokens (else it is whatever context each prompt leaves).
    max_tokens_given: bool = True

    @property
    def prompt_token_ids(self) -> list[int]:
        """The first (for most requests, the only) prompt."""
        return self.choices[0].prompt_token_ids

    @property
    def params(self) -> SamplingParams:
        return self.choices[0].params

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(c.prompt_token_ids) for c in self.choices)


def check_model(body: dict, ctx: ServingContext) -> str:
    if "model" not in body or body["model"] is None:
        raise bad_request("missing required field: model", "model")
    model = body["model"]
    if not isinstance(model, str):
        raise bad_request(f"model must be a string, got {_json_type(model)}", "model")
    if model not in ctx.served_model_names:
        raise ApiError(
            404,
            f"The model {_show(check_text(model, 'model'), 80)} does not exist; "
            f"this server serves {', '.join(ctx.served_model_names)}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return model


def _check_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request(f"only n=1 is supported, got n={_show(n)}", "n")
    for name, neutral in UNSUPPORTED_FIELDS.items():
        value = body.get(name)
        if not any(value == v and type(value) is type(v) for v in neutral) and value is not None:
            raise bad_request(f"{name} is not supported by this server (got {_show(value)})", name)


def _stop_tokens(body: dict, ctx: ServingContext) -> tuple[frozenset[int], tuple[int, ...]]:
    stop = body.get("stop")
    strings: list[str]
    if stop is None:
        strings = []
    elif isinstance(stop, str):
        strings = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOP_STRINGS:
            raise bad_request(
                f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(stop)}", "stop"
            )
        strings = stop
    else:
        raise bad_request("stop must be a string or an array of strings", "stop")
    from_strings = []
    for s in strings:
        ids = ctx.tokenizer.encode(check_text(s, "stop"))
        if len(ids) != 1:
            raise bad_request(
                f"stop string {_show(s)} is {len(ids)} tokens; this server supports stop "
                "strings of exactly one token (one word with the hash tokenizer). "
                "Use stop_token_ids for other stops.",
                "stop",
            )
        from_strings.append(ids[0])

    ids_value = body.get("stop_token_ids")
    explicit: list[int] = []
    if ids_value is not None:
        if not isinstance(ids_value, list):
            raise bad_request("stop_token_ids must be an array of integers", "stop_token_ids")
        if len(ids_value) > MAX_STOP_TOKEN_IDS:
            raise bad_request(
                f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids", "stop_token_ids"
            )
        vocab = ctx.tokenizer.vocab_size
        for token in ids_value:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise bad_request(
                    f"stop_token_ids must be integers in [0, {vocab}), got {_show(token)}",
                    "stop_token_ids",
                )
            explicit.append(token)
    merged = tuple(dict.fromkeys(explicit + from_strings))
    return frozenset(from_strings), merged


def _token_ids(prompt: list, ctx: ServingContext, where: str) -> list[int]:
    # The length bound first: a client's megabyte of ids is refused without walking it.
    if len(prompt) >= ctx.max_model_len:
        raise _no_room(ctx.max_model_len, len(prompt), "prompt", where)
    vocab = ctx.tokenizer.vocab_size
    for token in prompt:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise bad_request(
                f"{where} must be a string or an array of token ids (integers "
                f"in [0, {vocab})); found {_show(token)}",
                "prompt",
            )
    return list(prompt)


def _text_ids(text: str, ctx: ServingContext, field_name: str, where: str) -> list[int]:
    check_text(text, field_name)
    # A cheap lower bound on the count first, so an over-long text is refused without
    # being tokenized (tokenizing a megabyte of one-letter words costs half a second).
    bound = getattr(ctx.tokenizer, "num_tokens_lower_bound", None)
    if bound is not None and (at_least := bound(text)) >= ctx.max_model_len:
        raise _no_room(ctx.max_model_len, at_least, field_name, where, at_least=True)
    return ctx.tokenizer.encode(text)


def _no_room(
    max_len: int, num_prompt: int, param: str, where: str, at_least: bool = False
) -> ApiError:
    return bad_request(
        f"This model's maximum context length is {max_len} tokens; {where} has "
        f"{'at least ' if at_least else ''}{num_prompt} tokens, which leaves no room for output",
        param,
        "context_length_exceeded",
    )


def _prompts(body: dict, ctx: ServingContext) -> tuple[list[list[int]], bool]:
    """The prompts of a completion request as token ids, and whether ``prompt`` was a
    batch (a list of strings or of token-id lists, as in OpenAI and vLLM)."""
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("missing required field: prompt", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        prompts, batch = [_text_ids(prompt, ctx, "prompt", "the prompt")], False
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > MAX_BATCH_PROMPTS:
            raise bad_request(
                f"prompt may hold at most {MAX_BATCH_PROMPTS} prompts, got {len(prompt)}", "prompt"
            )
        prompts, batch = [], True
        for i, p in enumerate(prompt):
            where = f"prompt[{i}]"
            prompts.append(
                _text_ids(p, ctx, "prompt", where)
                if isinstance(p, str)
                else _token_ids(p, ctx, where)
            )
    elif isinstance(prompt, list):
        prompts, batch = [_token_ids(prompt, ctx, "prompt")], False
    else:
        raise bad_request(
            f"prompt must be a string, an array of token ids, or an array of "
            f"those (a batch), got {_json_type(prompt)}",
            "prompt",
        )
    for i, ids in enumerate(prompts):
        if not ids:
            raise bad_request(
                f"{f'prompt[{i}]' if batch else 'prompt'} is empty (zero tokens)", "prompt"
            )
    return prompts, batch


#: The opening of a role marker. In message content it is escaped (as ``<\|``), so no
#: content can produce the tokens of a marker — a user message cannot pose as a system
#: message, whatever it contains.
ROLE_MARKER_OPEN = "<|"
ESCAPED_MARKER_OPEN = "<\\|"


def render_chat(messages: list[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat template: one ``<|role|> content`` line per message, then the assistant
    cue ``<|assistant|>`` on its own line (unless ``add_generation_prompt`` is false).
    ``<|`` inside content becomes ``<\\|`` (a backslash between the two characters)."""
    lines = [
        f"<|{role}|> {content.replace(ROLE_MARKER_OPEN, ESCAPED_MARKER_OPEN)}"
        for role, content in messages
    ]
    if add_generation_prompt:
        lines.append("<|assistant|>")
    return "\n".join(lines)


def chat_messages(body: dict) -> list[tuple[str, str]]:
    if "messages" not in body or body["messages"] is None:
        raise bad_request("missing required field: messages", "messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad_request(f"messages must be an array, got {_json_type(messages)}", "messages")
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"messages may hold at most {MAX_MESSAGES} entries", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object, got {_json_type(message)}", "messages")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(
                f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {_show(role)}",
                "messages",
            )
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = check_text(content, "messages")
        elif isinstance(content, list):
            parts = []
            for part in content:
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise bad_request(
                        f"{where}.content: only text parts "
                        '({"type": "text", "text": "..."}) are supported',
                        "messages",
                    )
                parts.append(check_text(part["text"], "messages"))
            text = "\n".join(parts)
        else:
            raise bad_request(
                f"{where}.content must be a string, an array of text parts or "
                f"null, got {_json_type(content)}",
                "messages",
            )
        out.append((role, text))
    return out


def parse_generate_request(body: dict, kind: str, ctx: ServingContext) -> GenerateRequest:
    """Validate a /v1/completions (``kind="completion"``) or /v1/chat/completions
    (``kind="chat"``) body."""
    model = check_model(body, ctx)
    _check_unsupported(body)
    if kind == "chat":
        text = render_chat(chat_messages(body))
        prompts, batch = [_text_ids(text, ctx, "messages", "the prompt")], False
    else:
        prompts, batch = _prompts(body, ctx)

    max_len = ctx.max_model_len
    param = "prompt" if kind == "completion" else "messages"
    for i, ids in enumerate(prompts):
        if len(ids) >= max_len:
            raise _no_room(max_len, len(ids), param, f"prompt[{i}]" if batch else "the prompt")
    max_tokens_field = "max_tokens"
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens_field = "max_completion_tokens"
    max_tokens = _int(body, max_tokens_field, None, 1, INT64_MAX)
    if max_tokens is not None:
        for i, ids in enumerate(prompts):
            if len(ids) + max_tokens > max_len:
                where = f" prompt[{i}]" if batch else ""
                raise bad_request(
                    f"This model's maximum context length is {max_len} tokens; you requested "
                    f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt{where}, "
                    f"{max_tokens} for the completion). Lower {max_tokens_field} or shorten the "
                    "prompt.",
                    max_tokens_field,
                    "context_length_exceeded",
                )
    min_tokens = _int(body, "min_tokens", 0, 0, INT64_MAX)
    shortest = max_tokens if max_tokens is not None else max_len - max(map(len, prompts))
    if min_tokens > shortest:
        raise bad_request(
            f"min_tokens ({min_tokens}) must not exceed max_tokens ({shortest})", "min_tokens"
        )
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise bad_request(f"temperature must be >= 0, got {temperature}", "temperature")
    if temperature > FLOAT32_MAX:
        raise bad_request(
            f"temperature must be at most {FLOAT32_MAX:.7g} (sampling runs in "
            f"float32), got {temperature:g}",
            "temperature",
        )
    if temperature < GREEDY_TEMPERATURE:
        temperature = 0.0
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {top_p}", "top_p")
    if _as_float32(top_p) == 0.0:
        raise bad_request(
            f"top_p {top_p:g} rounds to 0 in float32, in which sampling runs; use at least 1e-38",
            "top_p",
        )
    top_k = _int(body, "top_k", -1, -1, INT32_MAX)
    if top_k == 0:
        top_k = -1  # 0 and -1 both mean "no top-k" (vLLM)
    seed = _int(body, "seed", None)
    stop_string_ids, stop_token_ids = _stop_tokens(body, ctx)
    ignore_eos = _bool(body, "ignore_eos", False)
    priority = _int(body, "priority", 0, INT32_MIN, INT32_MAX)
    stream = _bool(body, "stream", False)
    include_usage = continuous_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad_request(
                "stream_options is only allowed when stream is true", "stream_options"
            )
        if not isinstance(options, dict):
            raise bad_request("stream_options must be an object", "stream_options")
        include_usage = _bool(options, "include_usage", False)
        continuous_usage = _bool(options, "continuous_usage_stats", False)
    choices = [
        PromptChoice(
            ids,
            SamplingParams(
                # vLLM's default max_tokens: whatever context each prompt leaves.
                max_tokens=max_tokens if max_tokens is not None else max_len - len(ids),
                min_tokens=min_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                ignore_eos=ignore_eos,
                stop_token_ids=stop_token_ids,
            ),
        )
        for ids in prompts
    ]
    return GenerateRequest(
        kind,
        model,
        choices,
        priority,
        stream,
        include_usage,
        continuous_usage,
        stop_string_ids,
        batch,
        max_tokens is not None,
    )


# -- responses ---------------------------------------------------------------------------
def usage(num_prompt: int, num_completion: int) -> dict:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }


@dataclass
class ChoiceResult:
    """What one choice of a non-streamed response says."""

    text: str
    finish_reason: str
    num_prompt_tokens: int
    num_completion_tokens: int


def _usage_of(results: list[ChoiceResult]) -> dict:
    return usage(
        sum(r.num_prompt_tokens for r in results), sum(r.num_completion_tokens for r in results)
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

    def usage(self, num_prompt: int, num_completion: int) -> bytes:
        return (
            f'data: {self._head}"choices":[],"usage":'
            f"{dumps(usage(num_prompt, num_completion))}}}\n\n"
        ).encode()

    @staticmethod
    def error(err: ApiError) -> bytes:
        return f"data: {dumps(err.body())}\n\n".encode()


class IncrementalDetokenizer:
    """Text deltas from a growing token list, decoding only a short window each time
    (vLLM's prefix/read offsets): correct for any tokenizer whose decode is local, and
    holds text back while it ends in an incomplete UTF-8 character."""

    __slots__ = ("tokenizer", "ids", "prefix_offset", "read_offset")

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, new_ids: list[int]) -> str:
        ids = self.ids
        ids.extend(new_ids)
        decode = self.tokenizer.decode
        prefix_text = decode(ids[self.prefix_offset : self.read_offset])
        new_text = decode(ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(ids)
            return new_text[len(prefix_text) :]
        return ""
