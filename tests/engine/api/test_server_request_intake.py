"""What the server tells the engine about each request: when it arrived (stamped once
parsed, not when the step loop picked it up), its class (``X-Request-Class``), its
conversation turn (``X-Session-Turn``, else a chat's user messages), the client's trace
context (``traceparent``), and the engine's clock epoch so client-side
wall-clock records join engine records. Real HTTP on 127.0.0.1; the simulated
executor sleeps a fixed step time on the wall clock."""

from __future__ import annotations

import json
import socket
import threading
import time

from engine.records.step_record import StepRecord
from engine.serving.tokenizer import HashTokenizer
from engine.telemetry.metrics import install_metrics
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

TOKENIZER = HashTokenizer(4096)
STEP_S = 0.2
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def body(**fields) -> dict:
    return {"model": "tiny", "prompt": "hello world", "max_tokens": 2, "ignore_eos": True, **fields}


def recording_engine(step_s: float):
    engine = sim_engine(step_s=step_s)
    records: list[StepRecord] = []
    engine.observers.add(records.append)  # runs on the engine thread; list.append is atomic
    return engine, records


def ended(records: list[StepRecord], request_id: str):
    return next(s for r in records for s in r.finished if s.request_id == request_id)


def test_a_request_sent_mid_step_queues_for_the_rest_of_that_step():
    engine, records = recording_engine(STEP_S)
    with BackgroundServer(engine, TOKENIZER) as server:
        busy = threading.Thread(
            target=lambda: HttpClient(server.url).post_json(
                "/v1/completions", body(max_tokens=6), {"X-Request-Id": "busy"}
            )
        )
        busy.start()  # six 0.2 s steps
        deadline = time.monotonic() + 10
        while server.health()["num_steps"] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(STEP_S / 2)  # now in the middle of the second step
        sent_unix = time.time()
        status, headers, _ = HttpClient(server.url).post_json(
            "/v1/completions",
            body(),
            {"X-Request-Id": "late", "X-Request-Class": "chat", "traceparent": TRACEPARENT},
        )
        busy.join(30)
        health = server.health()
    assert status == 200 and headers["x-request-id"] == "late"
    late = ended(records, "late")
    during = [r for r in records if r.schedule_start <= late.arrival_time < r.execute_end]
    assert during, "arrival was stamped when the step loop picked the request up, not on arrival"
    step = during[0]
    assert late.first_scheduled_time >= step.execute_end
    assert late.queue_s >= step.execute_end - late.arrival_time > 0
    # the engine's epoch maps its clock to the client's wall clock: stamped after the
    # send (a few ms of slack for the two clocks' reads), and soon after it (a wrong
    # epoch is off by the process's age or more; the bound leaves room for a loaded
    # machine's connect and parse)
    skew = health["clock_epoch_unix"] + late.arrival_time - sent_unix
    assert -0.005 <= skew < 0.5, skew
    assert late.request_class == "chat" and late.traceparent == TRACEPARENT
    assert ended(records, "busy").request_class == ""


def test_health_publishes_the_clock_epoch():
    engine, _ = recording_engine(0.0)
    with BackgroundServer(engine, TOKENIZER) as server:
        status, _, raw = HttpClient(server.url).request("GET", "/health")
        now = time.time()
    health = json.loads(raw)
    assert status == 200
    assert health["clock_epoch_unix"] == engine.clock_epoch_unix
    assert abs(health["clock_epoch_unix"] + health["engine_time_s"] - now) < 0.5


def test_a_bad_request_class_is_a_400_naming_the_header():
    engine, records = recording_engine(0.0)
    with BackgroundServer(engine, TOKENIZER) as server:
        client = HttpClient(server.url)
        for bad in ("has space", "x" * 65, 'quote"d', ""):
            status, _, raw = client.post_json("/v1/completions", body(), {"X-Request-Class": bad})
            error = json.loads(raw)["error"]
            assert status == 400, (bad, raw)
            assert error["param"] == "X-Request-Class" and "X-Request-Class" in error["message"]
        status, _, _ = client.post_json(
            "/v1/completions", body(), {"X-Request-Id": "ok", "X-Request-Class": "batch/long-1"}
        )
    assert status == 200 and ended(records, "ok").request_class == "batch/long-1"


def test_an_invalid_traceparent_is_ignored_not_refused():
    engine, records = recording_engine(0.0)
    with BackgroundServer(engine, TOKENIZER) as server:
        client = HttpClient(server.url)
        for i, bad in enumerate(
            [
                "junk",
                "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
                TRACEPARENT.upper(),
                "ff" + TRACEPARENT[2:],
            ]
        ):
            status, _, _ = client.post_json(
                "/v1/completions", body(), {"X-Request-Id": f"t{i}", "traceparent": bad}
            )
            assert status == 200
    assert all(ended(records, f"t{i}").traceparent is None for i in range(4))


def test_a_failing_observer_never_fails_a_request_or_resets_the_engine():
    engine, _ = recording_engine(0.0)

    def broken(record: StepRecord) -> None:
        raise ValueError("observer bug")

    engine.observers.add(broken)
    with BackgroundServer(engine, TOKENIZER) as server:
        client = HttpClient(server.url)
        results = [client.post_json("/v1/completions", body(max_tokens=4)) for _ in range(5)]
        health = server.health()
    assert [status for status, _, _ in results] == [200] * 5
    assert all(json.loads(raw)["usage"]["completion_tokens"] == 4 for _, _, raw in results)
    assert health["num_observer_errors"] >= 5
    assert health["num_engine_errors"] == 0 and health["num_failed_requests"] == 0


def test_reusing_the_id_of_a_client_that_just_left_never_ends_the_new_request():
    """Client A streams id X and disconnects during a long step; client B sends id X
    right after. B is either refused cleanly (409, while A's request is still being
    aborted) or served in full — and it never receives A's abort."""
    engine, _ = recording_engine(STEP_S)
    with BackgroundServer(engine, TOKENIZER) as server:
        host, port = server.url.removeprefix("http://").split(":")
        raw = json.dumps(body(max_tokens=50, stream=True)).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nX-Request-Id: X\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
        )
        assert b"200" in sock.recv(4096).split(b"\r\n")[0]
        time.sleep(STEP_S * 1.5)  # mid-step, with tokens flowing
        sock.close()
        client = HttpClient(server.url)
        outcomes = []
        retry_until = time.monotonic() + 10  # A's abort lands within a step or two
        while time.monotonic() < retry_until:
            time.sleep(0.005)
            status, _, data = client.post_json(
                "/v1/completions", body(max_tokens=3), {"X-Request-Id": "X"}
            )
            outcomes.append(status)
            if status != 409:
                break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = server.health()
            if health["num_unfinished"] == 0 and health["num_in_flight"] == 0:
                break
            time.sleep(0.02)
    assert set(outcomes[:-1]) <= {409}
    assert outcomes[-1] == 200, outcomes
    assert json.loads(data)["usage"]["completion_tokens"] == 3
    assert health["num_unfinished"] == 0 and health["num_in_flight"] == 0


def _metric(text: str, name: str, turn: str) -> float:
    """The value of ``name{..., turn="<turn>"}`` in a /metrics page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and f'turn="{turn}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_conversation_turn_comes_from_x_session_turn_else_the_chats_user_messages():
    engine, records = recording_engine(0.0)
    install_metrics(engine, "tiny")  # prefix caching on (the default): counted by turn
    history = [
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "one two three four five six seven eight"},
        {"role": "assistant", "content": "nine ten"},
        {"role": "user", "content": "eleven"},
    ]
    chat = {"model": "tiny", "messages": history, "max_tokens": 2, "ignore_eos": True}
    with BackgroundServer(engine, TOKENIZER) as server:
        client = HttpClient(server.url)
        sent = {
            "said": ("/v1/completions", body(), {"X-Session-Turn": "7"}),
            "counted": ("/v1/chat/completions", chat, {}),
            "header wins": ("/v1/chat/completions", chat, {"X-Session-Turn": "1"}),
            "no turn": ("/v1/completions", body(), {}),
        }
        for request_id, (path, payload, headers) in sent.items():
            status, _, raw = client.post_json(
                path, payload, {"X-Request-Id": request_id, **headers}
            )
            assert status == 200, raw
        for bad in ("0", "-1", "two", "1.5", "1000001", "\u00b3", ""):
            status, _, raw = client.post_json("/v1/completions", body(), {"X-Session-Turn": bad})
            error = json.loads(raw)["error"]
            assert status == 400, (bad, raw)
            assert error["param"] == "X-Session-Turn" and "X-Session-Turn" in error["message"]
        _, _, page = client.request("GET", "/metrics")
    turns = {rid: ended(records, rid).request.session_turn for rid in sent}
    assert turns == {"said": 7, "counted": 2, "header wins": 1, "no turn": 0}
    # Each first admission's prompt tokens counted under its turn's label: 7 is "5+"
    text = page.decode()
    queries = "schedscope_prefix_cache_queries_by_turn_total"
    prompt = {rid: ended(records, rid).num_prompt_tokens for rid in sent}
    assert _metric(text, queries, "5+") == prompt["said"]
    assert _metric(text, queries, "2") == prompt["counted"]
    assert _metric(text, queries, "1") == prompt["header wins"]
    assert _metric(text, queries, "unknown") == prompt["no turn"]
    # the second chat repeats the first's prompt: its full blocks are hits, under turn 1
    hits = "schedscope_prefix_cache_hits_by_turn_total"
    assert _metric(text, hits, "1") == ended(records, "header wins").num_cached_tokens > 0
    assert _metric(text, hits, "2") == 0
