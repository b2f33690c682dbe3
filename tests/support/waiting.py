"""Waiting in a test for something another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str = "the condition", timeout_s: float = 30.0) -> T:
    """Call ``predicate`` every 20 ms until it returns something true, and return that.
    Fails the test, naming ``what``, if ``timeout_s`` seconds pass first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)
