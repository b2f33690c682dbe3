"""Validation of a ``/v1/completions`` or ``/v1/chat/completions`` body into a
:class:`~engine.api.generate_request.GenerateRequest`.

Validation is strict and explicit: every field is type-checked by hand (``True`` is an
``int`` in Python and is refused where a number is expected; NaN and infinities are
refused everywhere; every integer field, ``n`` included, takes JSON integers only, so
``2.0`` is refused everywhere), every bound is checked, and every failure is an
:class:`ApiError` whose message names the field and what was wrong (the bound it
breaks: "must be >= 1" for 0, "too large" for 2**63). A client mistake is always a 4xx.
Unknown keys are ignored (as vLLM does); known OpenAI features and vLLM sampling and
decoding extensions this server does not implement (:data:`UNSUPPORTED_FIELDS`) are
refused when set to anything but their neutral value.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from engine.api.chat_template import chat_messages, render_chat
from engine.api.errors import ApiError, bad_request
from engine.api.generate_request import GenerateRequest, PromptChoice, ServingContext
from engine.api.json_codec import check_text, json_type, show_value
from engine.core.sampling_params import SamplingParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: Below this a temperature is treated as greedy (vLLM's epsilon): dividing logits by a
#: denormal temperature overflows.
GREEDY_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 1024
#: At most this many prompts in one batched completion request.
MAX_BATCH_PROMPTS = 128
#: The largest float32: sampling runs in float32, so a temperature above it is infinite.
FLOAT32_MAX = 3.4028234663852886e38

#: Fields of the OpenAI API, and sampling and decoding extensions of vLLM's, that this
#: server does not implement, with the values that mean "not used" (accepted silently:
#: vLLM clients send some defaults on every request); anything else is a 400 naming the
#: field. A neutral value must match in type too: ``best_of: 1.0`` is not ``1``.
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
    # vLLM's
    "min_p": (None, 0, 0.0),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "prompt_logprobs": (None,),  # 0 is not neutral: the prompt tokens' own logprobs
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "guided_whitespace_pattern": (None,),
    "guided_decoding_backend": (None,),
    "structured_outputs": (None,),  # vLLM >= 0.10.2's form of the guided_* fields
    "early_stopping": (None, False),  # beam search's
    "include_stop_str_in_output": (None, False),  # a stop string's text is left out
    "skip_special_tokens": (None, True),  # output text never shows special tokens
    "allowed_token_ids": (None,),  # vLLM refuses an empty list too
    "bad_words": (None, []),
    "truncate_prompt_tokens": (None,),  # an over-long prompt is a 400, never cut
    "spaces_between_special_tokens": (None, True),  # no special tokens in the text
    "logits_processors": (None, []),
    "return_tokens_as_token_ids": (None, False),
    # vLLM's chat extensions: the server's one chat template, always with the cue
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
}
#: The integer fields among them: a value that is not an integer (``best_of: 1.0``) is
#: refused as on every integer field, before it is compared with the neutral values.
_UNSUPPORTED_INTEGERS = ("best_of", "top_logprobs", "prompt_logprobs", "truncate_prompt_tokens")


# -- field readers ----------------------------------------------------------------------
def _check_integer(value: Any, name: str) -> None:
    """The one rule of every integer field: a JSON integer. Not a boolean, and not a
    number with a fraction part or an exponent even when its value is whole (``2.0``,
    ``1e3``): the OpenAI API types these fields integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(
            f"{name} must be an integer, got {json_type(value)} {show_value(value)}", name
        )


def _int(body: dict, name: str, default: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> Any:
    value = body.get(name)
    if value is None:
        return default
    _check_integer(value, name)
    if not lo <= value <= hi:
        if value > hi and hi == INT64_MAX:  # e.g. 2**63: say so, not "must be >= 1"
            raise bad_request(
                f"{name} is too large: must be at most {hi} (int64), got {show_value(value)}",
                name,
            )
        bounds = f">= {lo}" if hi == INT64_MAX else f"in [{lo}, {hi}]"
        raise bad_request(f"{name} must be {bounds}, got {show_value(value)}", name)
    return value


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(
            f"{name} must be a number, got {json_type(value)} {show_value(value)}", name
        )
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
        raise bad_request(
            f"{name} must be a boolean, got {json_type(value)} {show_value(value)}", name
        )
    return value


# -- the request --------------------------------------------------------------------------
def check_model(body: dict, ctx: ServingContext) -> str:
    if "model" not in body or body["model"] is None:
        raise bad_request("missing required field: model", "model")
    model = body["model"]
    if not isinstance(model, str):
        raise bad_request(f"model must be a string, got {json_type(model)}", "model")
    if model not in ctx.served_model_names:
        raise ApiError(
            404,
            f"The model {show_value(check_text(model, 'model'), 80)} does not exist; "
            f"this server serves {', '.join(ctx.served_model_names)}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return model


def _check_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None:
        _check_integer(n, "n")  # as every integer field: n=1.0 is refused, as max_tokens=1.0
        if n != 1:
            raise bad_request(f"only n=1 is supported, got n={show_value(n)}", "n")
    for name, neutral in UNSUPPORTED_FIELDS.items():
        value = body.get(name)
        if value is not None and name in _UNSUPPORTED_INTEGERS:
            _check_integer(value, name)
        if not any(value == v and type(value) is type(v) for v in neutral) and value is not None:
            raise bad_request(
                f"{name} is not supported by this server (got {show_value(value)})", name
            )


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
                f"stop string {show_value(s)} is {len(ids)} tokens; this server supports stop "
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
                    f"stop_token_ids must be integers in [0, {vocab}), got {show_value(token)}",
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
                f"in [0, {vocab})); found {show_value(token)}",
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
            f"those (a batch), got {json_type(prompt)}",
            "prompt",
        )
    for i, ids in enumerate(prompts):
        if not ids:
            raise bad_request(
                f"{f'prompt[{i}]' if batch else 'prompt'} is empty (zero tokens)", "prompt"
            )
    return prompts, batch


def parse_generate_request(body: dict, kind: str, ctx: ServingContext) -> GenerateRequest:
    """Validate a /v1/completions (``kind="completion"``) or /v1/chat/completions
    (``kind="chat"``) body."""
    model = check_model(body, ctx)
    _check_unsupported(body)
    turn = 0
    if kind == "chat":
        messages = chat_messages(body)
        turn = sum(1 for role, _ in messages if role == "user")
        prompts, batch = [_text_ids(render_chat(messages), ctx, "messages", "the prompt")], False
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
        turn,
    )
