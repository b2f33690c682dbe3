"""JSON from and to clients: a request body parsed into a JSON object (valid UTF-8, no
NaN or infinities, nesting bounded; every failure a 400 that says what is wrong), the
compact dumps of every response, and the helpers error messages use to describe a
client's value (its JSON type, a short rendering, text UTF-8 can encode)."""

from __future__ import annotations

import json
import math
from typing import Any

from engine.api.errors import bad_request

#: JSON nested deeper than this is refused (naming the field) before any field is read:
#: nothing this API accepts nests more than a few levels, and deep values cost
#: recursion wherever they are echoed.
MAX_JSON_DEPTH = 32


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
        raise bad_request(f"request body must be a JSON object, got {json_type(body)}")
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


def json_type(value: Any) -> str:
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


def show_value(value: Any, limit: int = 40) -> str:
    """A short rendering of a client's value for an error message; never fails (a
    value nested too deeply to render is described, not rendered)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if json_depth(value, 8) >= 8:
        return f"(an {json_type(value)} nested 8 or more levels deep)"
    text = dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_text(value: str, name: str) -> str:
    """Refuse strings Python holds but UTF-8 cannot encode (lone surrogates from JSON)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{name} contains an unpaired UTF-16 surrogate", name) from None
    return value
