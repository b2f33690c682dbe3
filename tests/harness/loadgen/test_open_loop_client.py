"""The light replay client (harness/loadgen/open_loop_client.py) asks the server for the
same work as `schedscope run`'s load generator: a client that asked for greedy decoding
made every served step 16% cheaper than the load generator's, so the two clients' step
times, and the fits made under each, could not be compared."""

from __future__ import annotations

import asyncio

import pytest

from harness.loadgen.client import REQUEST_FIELDS
from harness.loadgen.open_loop_client import replay
from harness.profiles import RequestSpec
from tests.support.vllm_stub import VllmStub

pytestmark = [pytest.mark.slow]


def spec(i: int) -> RequestSpec:
    return RequestSpec(f"r{i}", i, 0, "chat", 8 + i, 5, 5, i % 2, 0.05 * i)


def test_replay_sends_what_the_load_generator_sends():
    with VllmStub() as stub:
        rows, _ = asyncio.run(replay(stub.url, [spec(0), spec(1)], vocab=1000, model="stub-model"))
    assert len(rows) == 2 and len(stub.bodies) == 2
    for body in stub.bodies:
        assert "temperature" not in body  # the server's default sampling, as Locust's
        assert {k: body[k] for k in REQUEST_FIELDS} == REQUEST_FIELDS
        assert body["min_tokens"] == body["max_tokens"] == 5
    assert [b["priority"] for b in stub.bodies] == [0, 1]


@pytest.mark.parametrize(
    "extra, what",
    [
        ({"session_id": "s-1", "turn": 2}, "a session's turn"),
        ({"shared": (("k", 8),)}, "a shared prefix"),
    ],
)
def test_replay_refuses_what_it_cannot_send_before_sending_anything(extra, what):
    from harness.loadgen.open_loop_client import ReplayError

    spec = RequestSpec("r-1", 0, 0, "c", 16, 2, 2, 0, 0.0, **extra)
    with pytest.raises(ReplayError, match=f"r-1 has {what}"):
        asyncio.run(replay("http://127.0.0.1:9", [spec], 1000))
