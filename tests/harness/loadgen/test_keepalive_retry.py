"""A request on a pooled keep-alive connection the server closed before answering is
sent again, once, on a fresh connection, and its row says ``retried`` (in process).

The server is tests/support/vllm_stub.py standing in for vLLM, whose uvicorn closes
idle keep-alive connections after 5 s: here after 0.3 s, and the close crosses the
next request (the stub closes the connection as that request arrives, before any
byte of a response), which the pool's liveness check cannot see coming.
"""

from __future__ import annotations

import time

from harness.loadgen.client import FastTransport, OpenAIClient, TransportError
from harness.loadgen.records import RECORD_COLUMNS
from harness.profiles.schedule import RequestSpec
from tests.support.vllm_stub import VllmStub

IDLE_S = 0.3


def spec(i: int) -> RequestSpec:
    return RequestSpec(f"req-{i}", i, 0, "c", 8, 3, 16, 0, 0.0)


def client_of(url: str) -> OpenAIClient:
    return OpenAIClient(
        FastTransport(url, 4, 10.0),
        endpoint="completions",
        model="stub-model",
        id_range=(300, 1200),
        continuous_usage=True,
    )


def send(client: OpenAIClient, i: int) -> dict:
    row = client.new_row(spec(i), "open", time.time(), False)
    client.send(row, spec(i))
    return row


def test_a_request_on_a_connection_the_server_closed_is_retried_once_on_a_fresh_one():
    with VllmStub(drop_idle_after_s=IDLE_S) as stub:
        client = client_of(stub.url)
        first = send(client, 0)
        again = send(client, 1)  # at once: the pooled connection is not idle yet
        time.sleep(2 * IDLE_S)
        late = send(client, 2)  # on the pooled connection, which the server drops
        right_after = send(client, 3)
        dropped = stub.dropped
    assert [r["status"] for r in (first, again, late, right_after)] == ["ok"] * 4, late["error"]
    assert [r["retried"] for r in (first, again, late, right_after)] == [False, False, True, False]
    assert late["output_tokens"] == 3 and late["error"] is None
    assert dropped == 1  # so the retry that succeeded went out on another connection


def test_streamed_requests_one_after_another_share_one_pooled_connection():
    """After ``[DONE]`` the client reads the stream to its end, so the connection goes
    back to the pool (it was closed instead whenever the last chunk came apart from
    ``[DONE]``, and the retry test above then saw no pooled connection to be dropped)."""
    with VllmStub() as stub:
        client = client_of(stub.url)
        rows = [send(client, i) for i in range(6)]
        connections = stub.connections
    assert [r["status"] for r in rows] == ["ok"] * 6
    assert connections == 1


def test_the_retry_takes_a_fresh_connection_not_another_idle_pooled_one():
    """Two pooled connections, both idle past the server's limit: the retry must not take
    the second (the server would drop it too)."""
    import gevent

    with VllmStub(drop_idle_after_s=IDLE_S) as stub:
        client = client_of(stub.url)
        both = [gevent.spawn(send, client, i) for i in (0, 1)]  # two connections at once
        gevent.joinall(both)
        assert [g.value["status"] for g in both] == ["ok", "ok"]
        time.sleep(2 * IDLE_S)
        late = send(client, 2)
        dropped = stub.dropped
    assert late["status"] == "ok" and late["retried"] is True, late
    assert dropped == 1


def test_a_retry_that_fails_too_is_the_request_s_error_naming_both():
    class Dropping:
        """A transport whose every request fails as on a connection the server closed."""

        def __init__(self) -> None:
            self.fresh = []

        def request(self, method, path, body, headers, fresh=False):
            self.fresh.append(fresh)
            raise TransportError("HTTPConnectionClosed: connection closed.", stale=not fresh)

    client = client_of("http://127.0.0.1:9")
    client.transport = Dropping()
    row = send(client, 0)
    assert client.transport.fresh == [False, True]  # once more, on a fresh connection
    assert row["status"] == "error" and row["retried"] is True
    assert "sent again on a fresh connection after" in row["error"]


def test_a_failure_on_a_fresh_connection_is_not_retried():
    with VllmStub() as stub:
        url = stub.url
    client = client_of(url)  # the server is gone: the connection is refused
    row = send(client, 0)
    assert row["status"] == "error" and row["retried"] is False


def test_the_record_has_the_retried_column():
    assert "retried" in RECORD_COLUMNS
