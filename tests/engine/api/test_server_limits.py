"""Serving, round three: what one client could take from every other.

The budget of heavy parsing (one worker at a time) handed out first come, first served,
so a flood of large bodies queued a small one behind all of them; one client's trickling
sockets could hold every connection; /tokenize had no bound of its own and encoded its
answer on the event loop. Each on an in-process server (real sockets on
loopback: 127.0.0.1 and, as other clients, 127.0.0.2 and 127.0.0.3, which Linux routes
to the loopback interface), bounded in count and time.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import pytest

from engine.api.connections import client_address, limited_client
from engine.api.heavy_work import HeavyWork
from engine.api.server import OFFLOAD_PARSE_BYTES, ServerSettings
from engine.serving.tokenizer import HashTokenizer
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

TOKENIZER = HashTokenizer(4096)
MAX_MODEL_LEN = 256
JSON = {"Content-Type": "application/json"}


# -- the heavy-work budget, on its own --------------------------------------------------
def grant_order(jobs: list[tuple[str, str, int]], limit: int = 1) -> list[str]:
    """The order in which ``jobs`` (name, client, cost) start, queued in that order
    while a first job holds every slot."""
    started: list[str] = []
    release = threading.Event()

    def hold() -> None:
        release.wait(10)

    async def main() -> None:
        work = HeavyWork(limit)
        holders = [asyncio.ensure_future(work.run(hold, client="x")) for _ in range(limit)]
        await asyncio.sleep(0.05)
        waiting = []
        for name, client, cost in jobs:
            waiting.append(
                asyncio.ensure_future(work.run(started.append, name, client=client, cost=cost))
            )
            await asyncio.sleep(0)  # queued in this order
        release.set()
        await asyncio.gather(*holders, *waiting)

    asyncio.run(main())
    return started


def test_a_small_body_waits_for_a_job_or_two_not_for_the_whole_flood():
    """A 100 KB body queued behind twenty 1 MB ones of the same client starts after at
    most one of them (first come, first served started it last)."""
    flood = [(f"big{i}", "a", 1 << 20) for i in range(20)]
    order = grant_order([*flood, ("small", "a", 100_000)])
    assert order.index("small") <= 1, order


def test_each_client_with_work_waiting_gets_a_turn_per_round():
    flood = [(f"a{i}", "attacker", 1 << 20) for i in range(6)]
    order = grant_order([*flood, ("b0", "other", 1 << 20), ("b1", "other", 1 << 20)])
    assert order[:4] == ["a0", "b0", "a1", "b1"], order
    assert sorted(order) == sorted(name for name, _, _ in [*flood, ("b0", 0, 0), ("b1", 0, 0)])


def test_a_large_body_is_not_passed_over_for_ever_by_smaller_ones():
    smalls = [(f"s{i}", "a", 70_000) for i in range(10)]
    order = grant_order([("large", "a", 1 << 20), *smalls])
    assert order.index("large") <= 1, order  # every other turn goes to the oldest


def test_a_client_never_holds_every_slot_while_another_waits():
    flood = [(f"a{i}", "attacker", 1 << 20) for i in range(6)]
    order = grant_order([*flood, ("b0", "other", 1 << 20)], limit=2)
    assert order.index("b0") <= 1, order


def test_a_caller_that_leaves_while_waiting_or_just_granted_keeps_no_slot():
    ran: list[str] = []
    release = threading.Event()

    async def main() -> None:
        work = HeavyWork(1)
        holder = asyncio.ensure_future(work.run(release.wait, 10, client="a"))
        await asyncio.sleep(0.05)
        leaving = asyncio.ensure_future(work.run(ran.append, "left", client="b", cost=1))
        granted_then_gone = asyncio.ensure_future(work.run(ran.append, "gone", client="c"))
        await asyncio.sleep(0)
        leaving.cancel()  # withdrawn while it waits
        release.set()
        await holder
        granted_then_gone.cancel()  # the slot was just handed to it: it passes on
        await asyncio.gather(leaving, granted_then_gone, return_exceptions=True)
        await asyncio.wait_for(work.run(ran.append, "after", client="d"), 5)
        assert work.num_running == 0 and work.num_waiting == 0

    asyncio.run(main())
    assert "left" not in ran and ran[-1] == "after"


# -- the heavy-work budget, served ---------------------------------------------------------
class GatedTokenizer(HashTokenizer):
    """The hash tokenizer, recording what it encodes in order (``"long"`` for a text of
    more than ``long_chars`` characters, ``"short"`` otherwise) and holding its first long
    text until ``release`` is set. On a large body encode runs inside the heavy-work
    slot, one job at a time, so its order is the order in which the budget granted it."""

    def __init__(self, long_chars: int) -> None:
        super().__init__(TOKENIZER.vocab_size)
        self.long_chars = long_chars
        self.encoded: list[str] = []
        self.release = threading.Event()
        self.holding = threading.Event()  # set while the first long text is held

    def encode(self, text: str) -> list[int]:
        kind = "long" if len(text) > self.long_chars else "short"
        first_long = kind == "long" and "long" not in self.encoded
        self.encoded.append(kind)
        if first_long:
            self.holding.set()
            self.release.wait(30)
        return super().encode(text)


def wait_for_heavy_work(live: BackgroundServer, num_waiting: int) -> None:
    """Until ``num_waiting`` jobs wait for the server's heavy-work budget (bounded: 30 s)."""

    async def count() -> int:
        return live.server.state.heavy_work.num_waiting

    deadline = time.monotonic() + 30
    while live.call(count(), timeout=10) != num_waiting:
        assert time.monotonic() < deadline, f"{num_waiting} jobs never waited together"
        time.sleep(0.01)


def test_a_chat_over_64_kib_is_served_while_a_flood_of_large_tokenize_bodies_still_waits():
    """Eight 400 KB /tokenize bodies at once, then a valid 100 KB chat from the same
    client: of the seven bodies that wait with it, the chat is served after at most two
    (first come, first served answered it after all of them: 0.13 s alone, 14.1 s
    behind 24 bodies of 1 MB). The first body is held while it is being tokenized, so
    the seven provably wait with the chat however fast this machine parses."""
    settings = ServerSettings(
        host="127.0.0.1", port=0, max_tokenize_body_bytes=1 << 20, max_tokenize_tokens=1 << 20
    )
    heavy = json.dumps({"prompt": "ab " * 133_000}).encode()
    chat = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    chat = chat[:-1] + b" " * 100_000 + b"}"  # whitespace: large, and cheap to parse
    assert len(chat) > OFFLOAD_PARSE_BYTES
    tokenizer = GatedTokenizer(long_chars=10_000)
    statuses: list[int] = []

    def send(path: str, body: bytes) -> None:
        conn = http.client.HTTPConnection(*live.url[7:].split(":"), timeout=60)
        try:
            conn.request("POST", path, body, JSON)
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        finally:
            conn.close()

    with BackgroundServer(sim_engine(max_model_len=MAX_MODEL_LEN), tokenizer, settings) as live:
        senders = [threading.Thread(target=send, args=("/tokenize", heavy)) for _ in range(8)]
        senders.append(threading.Thread(target=send, args=("/v1/chat/completions", chat)))
        try:
            senders[0].start()
            assert tokenizer.holding.wait(30)  # granted the slot at once, and held in it
            for thread in senders[1:8]:
                thread.start()
            wait_for_heavy_work(live, 7)
            senders[8].start()
            wait_for_heavy_work(live, 8)  # the chat waits with seven large bodies
        finally:
            tokenizer.release.set()
            for thread in senders:
                if thread.ident is not None:  # started
                    thread.join(120)
    assert statuses == [200] * 9, statuses
    assert tokenizer.encoded.count("long") == 8 and tokenizer.encoded[0] == "long"
    # Served first come, first served, all seven went first; now at most two of them do.
    assert tokenizer.encoded.index("short") - 1 <= 2, tokenizer.encoded


# -- /tokenize's own limits -------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizing():
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        max_tokenize_body_bytes=200 * 1024,
        max_tokenize_tokens=100,
        shutdown_timeout_s=1.0,
    )
    with BackgroundServer(sim_engine(max_model_len=MAX_MODEL_LEN), TOKENIZER, settings) as live:
        yield live


@pytest.fixture()
def tk(tokenizing):
    client = HttpClient(tokenizing.url)
    yield client
    client.close()


def error_of(status: int, data: bytes, expected: int) -> dict:
    assert status == expected, data
    return json.loads(data)["error"]


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_a_tokenize_body_over_its_own_limit_is_a_413_naming_it(tk, path):
    padding = b" " * (210 * 1024)
    status, _, data = tk.request("POST", path, b'{"prompt": "a"' + padding + b"}", JSON)
    error = error_of(status, data, 413)
    assert error["code"] == "request_too_large"
    assert "204800 bytes" in error["message"] and "--max-tokenize-body-bytes" in error["message"]
    # the generation routes keep theirs (1 MiB): the same size is read and served
    body = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 1}).encode()
    status, _, data = tk.request("POST", "/v1/completions", body[:-1] + padding + b"}", JSON)
    assert status == 200, data


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "w " * 101}, "prompt"),
        ({"messages": [{"role": "user", "content": "w " * 99}]}, "messages"),  # + 2 markers
    ],
)
def test_more_tokens_than_the_tokenize_limit_is_a_400_naming_it(tk, body, param):
    status, _, data = tk.post_json("/tokenize", body)
    error = error_of(status, data, 400)
    assert error["param"] == param and error["code"] == "too_many_tokens"
    assert "at most 100 tokens" in error["message"] and "--max-tokenize-tokens" in error["message"]
    status, _, data = tk.post_json("/tokenize", {"prompt": "w " * 100})  # the limit itself
    assert status == 200 and json.loads(data)["count"] == 100


def test_detokenize_decodes_at_most_the_tokenize_limit(tk):
    status, _, data = tk.post_json("/detokenize", {"tokens": [5] * 101})
    error = error_of(status, data, 400)
    assert error["param"] == "tokens" and error["code"] == "too_many_tokens"
    assert tk.post_json("/detokenize", {"tokens": [5] * 100})[0] == 200


def test_a_large_tokenize_answer_is_encoded_off_the_event_loop(monkeypatch):
    """The answer of a large body is encoded on the worker thread that parsed it (a 10 MB
    answer encoded on the event loop stalled /health 0.63 s)."""
    import engine.api.tokenize_routes as routes

    threads: list[str] = []
    real = routes.dumps

    def spy(obj):
        threads.append(threading.current_thread().name)
        return real(obj)

    monkeypatch.setattr(routes, "dumps", spy)
    with BackgroundServer(sim_engine(max_model_len=MAX_MODEL_LEN), TOKENIZER) as live:
        client = HttpClient(live.url)
        words = "ab " * (OFFLOAD_PARSE_BYTES // 3 + 1000)
        status, _, data = client.post_json(
            "/tokenize", {"prompt": words, "return_token_strs": True}
        )
        client.close()
    assert status == 200 and json.loads(data)["count"] == len(words.split())
    assert threads and "schedscope-server" not in threads, threads  # the loop's thread


# -- connections per client ------------------------------------------------------------
def connect_from(live, source: str) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))


def request_from(live, source: str, path: str = "/version") -> int:
    host, port = live.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def reply_within(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    try:
        return sock.recv(65536)
    except TimeoutError:
        return b""


def test_one_clients_trickling_sockets_cannot_take_the_connections_of_another():
    """One client (127.0.0.2) opens as many connections as the server holds and
    trickles a request on each: it holds its half, its other connections get a 429 at
    once, and other clients (127.0.0.3, and this machine's own 127.0.0.1) are served
    throughout (before, the trickling sockets held all eight: everyone else got 503)."""
    settings = ServerSettings(host="127.0.0.1", port=0, max_connections=8, header_timeout_s=5)
    with BackgroundServer(sim_engine(), TOKENIZER, settings) as live:
        held, replies = [], []
        try:
            for _ in range(8):
                sock = connect_from(live, "127.0.0.2")
                held.append(sock)
                replies.append(reply_within(sock, 0.2))  # refused at once, or taken
                if not replies[-1]:  # taken: now part-way through a request, busy
                    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nX-Slow: ")
            refused = [r for r in replies if r]
            assert len(refused) == 4, replies  # half of the 8: the default per client
            for reply in refused:
                assert reply.startswith(b"HTTP/1.1 429 "), reply[:100]
                assert b"Retry-After: 1" in reply
                body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
                assert body["error"]["code"] == "too_many_client_connections"
            for _ in range(5):
                assert request_from(live, "127.0.0.3") == 200
                assert request_from(live, "127.0.0.1") == 200
            assert live.health()["num_refused_connections"] == 4
            deadline = time.monotonic() + 5  # the server sees the last client's close soon
            while live.health()["num_open_connections"] != 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert live.health()["num_open_connections"] == 4  # the held ones
        finally:
            for sock in held:
                sock.close()


def test_a_client_at_its_cap_makes_room_by_closing_its_own_idle_connection():
    settings = ServerSettings(
        host="127.0.0.1", port=0, max_connections_per_client=2, header_timeout_s=30
    )
    with BackgroundServer(sim_engine(), TOKENIZER, settings) as live:
        host, port = live.url.removeprefix("http://").split(":")
        idle = [
            http.client.HTTPConnection(host, int(port), timeout=10, source_address=("127.0.0.2", 0))
            for _ in range(2)
        ]
        try:
            for conn in idle:  # one request each, then kept open, idle
                conn.request("GET", "/ping")
                conn.getresponse().read()
            other = connect_from(live, "127.0.0.3")  # another client's idle one stays
            assert request_from(live, "127.0.0.2") == 200
            health = live.health()
            assert health["num_evicted_connections"] == 1
            assert health["num_refused_connections"] == 0
            other.close()
        finally:
            for conn in idle:
                conn.close()


def test_connections_from_the_servers_own_address_are_not_limited():
    """A load generator beside the server connects from the server's own address: it
    may open as many connections as the server holds."""
    settings = ServerSettings(
        host="127.0.0.1", port=0, max_connections_per_client=1, header_timeout_s=30
    )
    with BackgroundServer(sim_engine(), TOKENIZER, settings) as live:
        clients = [HttpClient(live.url) for _ in range(4)]
        try:
            for client in clients:
                assert client.request("GET", "/ping")[0] == 200
            health = live.health()
            assert health["num_open_connections"] == 4
            assert health["num_refused_connections"] == health["num_evicted_connections"] == 0
        finally:
            for client in clients:
                client.close()


class FakeTransport:
    def __init__(self, peer, local):
        self.extra = {"peername": peer, "sockname": local}

    def get_extra_info(self, name):
        return self.extra.get(name)


@pytest.mark.parametrize(
    "peer,local,client",
    [
        (("10.0.0.7", 4000), ("10.0.0.1", 8000), "10.0.0.7"),
        (("127.0.0.2", 4000), ("127.0.0.1", 8000), "127.0.0.2"),
        (("127.0.0.1", 4000), ("127.0.0.1", 8000), None),  # this machine
        (("2001:db8::1", 4000, 0, 0), ("2001:db8::2", 8000, 0, 0), "2001:db8::/64"),
        (("2001:db8::ab:1", 4000, 0, 0), ("2001:db8:1::1", 8000, 0, 0), "2001:db8::/64"),
        (("::ffff:10.0.0.7", 4000, 0, 0), ("::ffff:10.0.0.1", 8000, 0, 0), "10.0.0.7"),
        (("::1", 4000, 0, 0), ("::1", 8000, 0, 0), None),
        ("/run/server.sock", "/run/server.sock", None),  # no IP: nothing to count by
    ],
)
def test_the_client_a_connection_counts_against(peer, local, client):
    assert limited_client(FakeTransport(peer, local)) == client
    if client is not None:
        assert client_address(peer) == client
