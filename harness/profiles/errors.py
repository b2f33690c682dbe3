"""The one error type of the profile model, and the field checks that raise it.

Every message starts with the offending key (``weight: ...``) so that the loader can
prefix the path it is at (``classes[1].weight: ...``) and then the file name.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Names end up in request ids, file names and metric labels: keep them plain.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class ProfileError(ValueError):
    """An invalid load profile; the message names the key path and the bad value."""


def check_int(
    key: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    # bool is an int subclass; `max_tokens = true` is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{key}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProfileError(f"{key}: must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ProfileError(f"{key}: must be <= {maximum:,}, got {value!r}")
    return value


def check_number(
    key: str, value: Any, *, positive: bool = False, non_negative: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{key}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ProfileError(f"{key}: must be finite, got {value!r}")
    if positive and value <= 0:
        raise ProfileError(f"{key}: must be > 0, got {value!r}")
    if non_negative and value < 0:
        raise ProfileError(f"{key}: must be >= 0, got {value!r}")
    return float(value)


def check_name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ProfileError(
            f"{key}: expected a name of letters, digits, '_', '.' or '-' "
            f"(starting with a letter or digit), got {value!r}"
        )
    return value
