"""harness.serve.local_server.CliServer's start-up timeout: a server that has not printed its
start-up line in time is stopped, and the caller gets a TimeoutError with what it printed
(not a FileNotFoundError for the log the stop had already removed)."""

from __future__ import annotations

import pytest

from harness.serve.local_server import CliServer


def test_a_server_that_does_not_start_in_time_raises_timeout_error_and_is_stopped() -> None:
    server = CliServer(["--executor", "sim"], start_timeout_s=0.0, stop_timeout_s=10.0)
    with pytest.raises(TimeoutError, match="server did not start within 0.0 s"):
        server.__enter__()
    assert server.process.poll() is not None  # stopped, not left running
