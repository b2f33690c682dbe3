"""A free TCP port on the loopback interface, for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now: bound to port 0 so the kernel
    picks it, then released. Another process may take it before the caller binds it
    (rare on loopback); a connection to it is refused until someone does."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
