"""Real components a test needs beyond Python (Debian's prometheus and promtool,
chromium): found on this machine, or the test is skipped — except in CI
(``CI=true``), where a missing component fails the test, never skips it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str, install: str) -> None:
    """Fail (CI) or skip (elsewhere) a test whose component is not installed."""
    message = f"{what} is not installed ({install}; `make system-deps` installs it)"
    if in_ci():
        pytest.fail(message + "; CI must not skip this test")
    pytest.skip(message)


def promtool() -> str:
    """Path of Debian's promtool (package prometheus)."""
    path = shutil.which("promtool")
    if path is None:
        missing("promtool", "apt-get install -y --no-install-recommends prometheus")
    return path


#: Warnings that vLLM's own names carry (the colon, and its _total histogram).
ALLOWED_PROMTOOL_LINT = (
    re.compile(r"^\S+ metric names should not contain ':'$"),
    re.compile(
        r'^vllm:iteration_tokens_total non-counter metrics should not have "_total" '
        r"suffix$"
    ),
)


def check_with_promtool(text: bytes) -> None:
    """`promtool check metrics` accepts an exposition, vLLM's own name warnings aside."""
    result = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, timeout=60
    )
    lines = (result.stdout + result.stderr).decode().splitlines()
    problems = [
        x for x in lines if x.strip() and not any(p.match(x) for p in ALLOWED_PROMTOOL_LINT)
    ]
    assert not problems, problems
    assert result.returncode in (0, 3), lines  # 3: lint warnings only
