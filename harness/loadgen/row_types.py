"""A records row checked against its columns' types before the merge builds a frame.

The client checks what a target sends (harness/loadgen/target_values.py), so the rows
it writes have one type per column. This is the merge's own guard, for a row written
otherwise (an older or patched client, a hand-edited file): Polars given a row whose
value does not fit its column either fails the whole frame (a string in an integer
column: ``ComputeError``; a lone surrogate in a string: ``UnicodeEncodeError``) or
converts it silently (``1.5`` to ``1``, ``5`` to ``"5"``), so every value is checked
here, one row at a time. A value that does not fit becomes null and its row an
``error`` saying which field held what: one bad row never fails the cell's merge.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from harness.loadgen.target_values import MAX_ERROR_CHARS

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
FLOAT_MAX = 1 << 1023

_MISSING = object()


def _string(value):
    if type(value) is not str:
        return _MISSING
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 column can hold it
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def _int(value):
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return value
    if type(value) is float and value.is_integer() and INT64_MIN <= value <= INT64_MAX:
        return int(value)
    return _MISSING


def _float(value):
    # an int Polars turns into a float itself, unless no float can hold it
    if type(value) is float or (type(value) is int and -FLOAT_MAX <= value <= FLOAT_MAX):
        return value
    return _MISSING


def _bool(value):
    return value if type(value) is bool else _MISSING


def _floats(value):
    if type(value) is not list:
        return _MISSING
    if all(type(x) is float for x in value) or all(_float(x) is x for x in value):
        return value
    return _MISSING


#: Each record kind (records.RECORD_KINDS) -> its check: the value itself when it fits,
#: a converted value the column can hold, or _MISSING.
_CHECKS: dict[str, Callable] = {
    "str": _string,
    "int": _int,
    "float": _float,
    "bool": _bool,
    "floats": _floats,
}


def fits(value, kind: str) -> bool:
    """Whether ``value`` is of ``kind`` as it is, with no conversion."""
    return _CHECKS[kind](value) is value


def checker(kinds: Mapping[str, str]) -> Callable[[dict], dict]:
    """A function that returns a row with every value of ``kinds``' columns (column ->
    record kind) fitting its type (the row itself when all fit): a value that does not
    is null, the row's ``status`` ``error`` and its ``error`` names the field and the
    value (before any error it had)."""
    checks = [(name, _CHECKS[kind]) for name, kind in kinds.items()]

    def conform(row: dict) -> dict:
        fixed: dict | None = None
        bad: list[str] = []
        for name, check in checks:
            value = row.get(name)
            if value is None:
                continue
            got = check(value)
            if got is value:
                continue
            if fixed is None:
                fixed = dict(row)
            if got is _MISSING:
                fixed[name] = None
                bad.append(f"record field {name} held {_shown(value)}: not its type")
            else:
                fixed[name] = got
        if fixed is None:
            return row
        if bad:
            before = fixed.get("error") if isinstance(fixed.get("error"), str) else None
            fixed["status"] = "error"
            fixed["error"] = "; ".join([*bad, *([before] if before else [])])[:MAX_ERROR_CHARS]
        return fixed

    return conform


def _shown(value) -> str:
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"
