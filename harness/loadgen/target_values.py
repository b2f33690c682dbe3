"""What the load generator accepts from a target, and the bounds on what it reads.

A target is any server at ``--target URL``: it may be broken or hostile. Every value it
sends that the client reads (a streamed chunk's usage counts, texts, finish reason and
error event; an error body's message) is checked here before it reaches a record, so
that a bad value makes that one request's row an ``error`` whose message names the
field, and never fails another request, the merge of the records (one column type per
field, ``harness/loadgen/merge.py``) or the generator's memory. docs/loadgen.md, "What a
target may send", lists the checks and bounds.

Stdlib only (runs under gevent).
"""

from __future__ import annotations

import json
from typing import NamedTuple, TypeGuard

#: An error message from a target is cut to this many characters.
MAX_ERROR_CHARS = 500
#: A finish reason longer than this is not one (vLLM's are "stop", "length", "abort").
MAX_FINISH_REASON_CHARS = 64
#: How much of a bad value an error message quotes.
MAX_SHOWN_CHARS = 60
#: The longest line of a streamed body (a chunk of one token's text is far shorter): a
#: longer one ends the request as an error instead of growing a buffer without end.
MAX_LINE_BYTES = 1 << 20
#: A stream may carry this many bytes, plus PER_TOKEN_BYTES for each token asked
#: (``max_tokens``), comments and keep-alive lines included; then the request ends as
#: an error. vLLM sends about 250 bytes per token with continuous usage.
BODY_BASE_BYTES = 1 << 20
PER_TOKEN_BYTES = 64 << 10
#: The part of an error body (a non-200 answer) that is read for its message.
ERROR_BODY_BYTES = 64 << 10
#: What the start-up probes read of an answer (/v1/models, /health, /tokenize).
PROBE_BODY_BYTES = 16 << 20
#: A usage ``prompt_tokens`` above FACTOR x the prompt's target length + SLACK is not a
#: count of this prompt (SLACK covers a chat template and a tokenizer that splits the
#: words of a text prompt finely).
PROMPT_TOKENS_FACTOR = 10
PROMPT_TOKENS_SLACK = 10_000


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number as it is: an int or a float, not a bool (``type``, not ``isinstance``)."""
    return type(value) in (int, float)


class BadTargetValue(ValueError):
    """A value a target sent that the client cannot record; the message names it."""


def body_limit(max_tokens: int) -> int:
    """The bytes a stream asked for ``max_tokens`` tokens may carry."""
    return BODY_BASE_BYTES + PER_TOKEN_BYTES * max(max_tokens, 1)


def prompt_limit(prompt_tokens: int) -> int:
    """The largest usage ``prompt_tokens`` taken for a prompt of this target length."""
    return PROMPT_TOKENS_FACTOR * max(prompt_tokens, 0) + PROMPT_TOKENS_SLACK


def clean_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, each character that is not printable
    (control characters such as ESC and newlines, bidirectional overrides, lone
    surrogates, which no UTF-8 file or Parquet column can hold) replaced by a space: a
    target's words reach consoles, logs and reports."""
    if len(text) > limit:
        text = text[: max(limit - 1, 0)] + "…"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " for c in text)


def shown(value: object) -> str:
    """A bad value as an error message quotes it: JSON, cut short, printable."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return clean_text(text, MAX_SHOWN_CHARS)


#: A float count above this is not exact (2**53): not taken as a count.
MAX_FLOAT_COUNT = float(1 << 53)


def token_count(value: object, field: str) -> int:
    """``value`` as a token count: an int >= 0 (not a bool), or a float with an integral
    value up to 2**53; anything else is a BadTargetValue naming ``field``. How large a
    count may be is the caller's to bound (it knows what was asked)."""
    if type(value) is int:
        if value >= 0:
            return value
    # NaN and infinities are not integral
    elif type(value) is float and value.is_integer() and 0 <= value <= MAX_FLOAT_COUNT:
        return int(value)
    raise BadTargetValue(f"target sent {field} {shown(value)}: not a token count")


def error_text(value: object) -> str:
    """The message of an error object (``{"message": ...}`` or the value itself), cleaned
    and cut to MAX_ERROR_CHARS."""
    if isinstance(value, dict) and "message" in value:
        value = value["message"]
    return clean_text(value if isinstance(value, str) else shown_full(value))


def shown_full(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)[: MAX_ERROR_CHARS + 1]
    except (TypeError, ValueError):
        return repr(value)[: MAX_ERROR_CHARS + 1]


def error_message(body: bytes) -> str:
    """An error body's message: OpenAI's ``{"error": {"message": ...}}``, vLLM's
    ``{"message": ...}``, else the body's text; cleaned and cut to MAX_ERROR_CHARS."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return clean_text(body[: MAX_ERROR_CHARS * 4].decode("utf-8", "replace"))
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict) and "message" in err:
        return error_text(err)
    return clean_text(body[: MAX_ERROR_CHARS * 4].decode("utf-8", "replace"))


class Chunk(NamedTuple):
    """What one streamed ``data:`` line says, checked."""

    #: the message of an error event (``{"error": ...}``), else None
    error: str | None
    #: the chunk has a choice (a token chunk), not only usage
    choice: bool
    #: the choice's text (or chat delta's content) is not empty
    text: bool
    finish_reason: str | None
    #: the usage's counts (None: no usage, or no such count)
    completion_tokens: int | None
    prompt_tokens: int | None
    usage: bool
    #: ``usage.prompt_tokens_details.cached_tokens`` (OpenAI's and vLLM's prompt tokens
    #: found in the prefix cache; None: not sent)
    cached_tokens: int | None = None
    #: the choice's text itself (a session keeps its answer to send it back)
    content: str = ""


def parse_chunk(data: bytes, chat: bool) -> Chunk:
    """One ``data:`` line's JSON (the ``data:`` prefix removed), every field the client
    reads checked; BadTargetValue naming the first bad one."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadTargetValue(
            f"target sent a data line that is not JSON: {shown(data.decode('utf-8', 'replace'))}"
        ) from None
    if type(obj) is not dict:
        raise BadTargetValue(f"target sent a data line that is not a JSON object: {shown(obj)}")
    if "error" in obj:
        return Chunk(error_text(obj["error"]), False, False, None, None, None, False)
    choices = obj.get("choices")
    if choices is None:
        choices = ()
    elif type(choices) is not list:
        raise BadTargetValue(f"target sent choices {shown(choices)}: not a list")
    usage = obj.get("usage")
    completion = prompt = cached = None
    if usage is not None:
        if type(usage) is not dict:
            raise BadTargetValue(f"target sent usage {shown(usage)}: not an object")
        value = usage.get("completion_tokens")
        if value is not None:
            completion = token_count(value, "usage.completion_tokens")
        value = usage.get("prompt_tokens")
        if value is not None:
            prompt = token_count(value, "usage.prompt_tokens")
        details = usage.get("prompt_tokens_details")
        if details is not None:
            if type(details) is not dict:
                raise BadTargetValue(
                    f"target sent usage.prompt_tokens_details {shown(details)}: not an object"
                )
            value = details.get("cached_tokens")
            if value is not None:
                cached = token_count(value, "usage.prompt_tokens_details.cached_tokens")
                if prompt is not None and cached > prompt:
                    raise BadTargetValue(
                        f"target sent usage.prompt_tokens_details.cached_tokens {cached}: "
                        f"more than its usage.prompt_tokens {prompt}"
                    )
    if not choices:
        return Chunk(None, False, False, None, completion, prompt, bool(usage), cached)
    choice = choices[0]
    if type(choice) is not dict:
        raise BadTargetValue(f"target sent choices[0] {shown(choice)}: not an object")
    finish = choice.get("finish_reason")
    if finish is not None:
        if type(finish) is not str or len(finish) > MAX_FINISH_REASON_CHARS:
            raise BadTargetValue(
                f"target sent choices[0].finish_reason {shown(finish)}: not a finish reason"
            )
        finish = clean_text(finish, MAX_FINISH_REASON_CHARS)
    if chat:
        delta = choice.get("delta")
        if delta is not None and type(delta) is not dict:
            raise BadTargetValue(f"target sent choices[0].delta {shown(delta)}: not an object")
        text = delta.get("content") if delta else None
        where = "choices[0].delta.content"
    else:
        text = choice.get("text")
        where = "choices[0].text"
    if text is not None and type(text) is not str:
        raise BadTargetValue(f"target sent {where} {shown(text)}: not a string")
    return Chunk(
        None, True, bool(text), finish or None, completion, prompt, bool(usage), cached, text or ""
    )
