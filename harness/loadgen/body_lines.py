"""A streamed body's lines, each no longer than a bound.

The transports' own line readers (geventhttpclient's ``readline``, requests'
``iter_lines``) buffer a line until its end comes, however long: a target that streams
one endless line would grow the load generator's memory until the run stops. Here the
body is read as the pieces arrive, split at ``\\n``, and a line that passes the bound
before its end is a BadTargetValue (the request's row an ``error``; docs/loadgen.md,
"What a target may send").

Stdlib only (runs under gevent).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from harness.loadgen.target_values import BadTargetValue


class LineTooLong(BadTargetValue):
    """A line of the body passed the bound before its end."""


def bounded_lines(pieces: Iterable[bytes], max_bytes: int) -> Iterator[bytes]:
    """The lines of the body that ``pieces`` make up, without their ``\\n`` or
    ``\\r\\n``, as soon as each is complete; a last line without an end is given too.
    LineTooLong as soon as a line is longer than ``max_bytes``."""
    pending = bytearray()
    scanned = 0  # bytes of ``pending`` known to hold no line end
    for piece in pieces:
        pending += piece
        start = 0
        while True:
            end = pending.find(b"\n", scanned)
            if end < 0:
                break
            yield bytes(pending[start:end]).rstrip(b"\r")
            start = scanned = end + 1
        if start:
            del pending[:start]
        scanned = len(pending)
        if scanned > max_bytes:
            raise LineTooLong(
                f"target sent a line longer than {max_bytes} bytes: {bytes(pending[:40])!r}..."
            )
    if pending:
        yield bytes(pending).rstrip(b"\r")
