"""The line ``schedscope serve`` prints once it accepts requests, and how a parent
process reads its URL from the server's output (the harness waits for it). Standard
library only: a parent imports it without the server's dependencies."""

from __future__ import annotations

#: What the server prints once it accepts requests, followed by its URL: the line a
#: parent process waits for (:func:`serving_url`).
SERVING_LINE = "schedscope serving on "


def serving_url(output: str) -> str | None:
    """The URL of the first start-up line in a server's ``output``; None before it."""
    for line in output.splitlines():
        if line.startswith(SERVING_LINE):
            return line[len(SERVING_LINE) :].strip()
    return None
