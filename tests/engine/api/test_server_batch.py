"""Batched completion prompts and vLLM's continuous usage stats.

``"prompt"`` as a list of strings or of token-id lists is a batch, as in OpenAI and
vLLM: one choice per prompt with its ``index``, usage summed, streamed choices
interleaved by index. One live in-process server (sim executor) for the module; the
hash tokenizer makes counts exact and the sim executor never emits EOS.
"""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from engine.serving.tokenizer import HashTokenizer
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

MODEL = "tiny"
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(
        sim_engine(step_s=0.001, max_model_len=MAX_MODEL_LEN), HashTokenizer(4096)
    ) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def sse_events(data: bytes) -> list:
    events = []
    for block in data.split(b"\n\n"):
        if block.startswith(b"data: "):
            payload = block[len(b"data: ") :]
            events.append(payload if payload == b"[DONE]" else json.loads(payload))
    return events


def test_a_list_of_strings_is_a_batch_with_one_choice_per_prompt(client):
    completion = client.completions.create(
        model=MODEL,
        prompt=["one two", "three four five", "six"],
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in completion.choices)
    assert completion.usage.prompt_tokens == 2 + 3 + 1
    assert completion.usage.completion_tokens == 3 * 4
    assert completion.usage.total_tokens == 6 + 12


def test_a_list_of_token_id_lists_is_a_batch(client):
    completion = client.completions.create(
        model=MODEL, prompt=[[5, 6, 7], [8]], max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert len(completion.choices) == 2
    assert completion.usage.prompt_tokens == 4 and completion.usage.completion_tokens == 4


def test_a_batch_of_one_is_still_a_batch_and_a_flat_id_list_is_one_prompt(client):
    batch = client.completions.create(model=MODEL, prompt=["a b"], max_tokens=1)
    assert len(batch.choices) == 1 and batch.usage.prompt_tokens == 2
    single = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=1)
    assert len(single.choices) == 1 and single.usage.prompt_tokens == 3


def test_without_max_tokens_each_prompt_fills_its_own_context(client):
    completion = client.completions.create(
        model=MODEL, prompt=["a", "a b c"], extra_body={"ignore_eos": True}
    )
    assert completion.usage.completion_tokens == (MAX_MODEL_LEN - 1) + (MAX_MODEL_LEN - 3)


def test_a_bad_prompt_in_a_batch_is_a_400_naming_its_index(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt=["fine", " ".join(["w"] * 200)], max_tokens=1)
    assert "prompt[1]" in raised.value.body["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt=["fine", ""], max_tokens=1)
    assert "prompt[1] is empty" in raised.value.body["message"]


def test_a_streamed_batch_interleaves_choices_by_index(client):
    stream = client.completions.create(
        model=MODEL,
        prompt=["one two", "three"],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts: dict[int, list[str]] = {0: [], 1: []}
    finishes: dict[int, str] = {}
    order = []
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            order.append(choice.index)
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
            elif choice.text:
                texts[choice.index].append(choice.text)
    assert finishes == {0: "length", 1: "length"}
    assert all(len(" ".join(t).split()) == 5 for t in texts.values())
    # Both prompts run in the same steps, so their chunks alternate rather than one
    # prompt's stream following the other's.
    assert order[:4] != [0, 0, 0, 0] and set(order) == {0, 1}
    assert usage.prompt_tokens == 3 and usage.completion_tokens == 10


def test_continuous_usage_stats_put_usage_on_every_chunk(server):
    http = HttpClient(server.url)
    status, _, data = http.post_json(
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "a b c",
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    http.close()
    assert status == 200
    events = sse_events(data)
    assert events[-1] == b"[DONE]"
    chunks = events[:-1]
    assert all(chunk["usage"] is not None for chunk in chunks)
    with_tokens = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    counts = [c["usage"]["completion_tokens"] for c in with_tokens]
    assert counts == sorted(counts) and counts[-1] == 4
    assert all(c["usage"]["prompt_tokens"] == 3 for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7


def test_continuous_usage_stats_without_include_usage_adds_nothing(server):
    http = HttpClient(server.url)
    status, _, data = http.post_json(
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "a b c",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"continuous_usage_stats": True},
        },
    )
    http.close()
    assert status == 200
    assert all("usage" not in chunk for chunk in sse_events(data)[:-1])


def test_a_client_leaving_a_streamed_batch_aborts_every_prompt():
    """50 ms steps: the three prompts would run for about 6 s; leaving ends them all
    within a few steps and frees their blocks."""
    with BackgroundServer(
        sim_engine(step_s=0.05, max_model_len=MAX_MODEL_LEN), HashTokenizer(4096)
    ) as server:
        host, port = server.url.removeprefix("http://").split(":")
        body = json.dumps(
            {
                "model": MODEL,
                "prompt": ["a", "b", "c"],
                "max_tokens": 120,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            assert server.health()["num_running"] == 3
        deadline = time.monotonic() + 3
        while True:
            health = server.health()
            if health["num_unfinished"] == 0 and health["num_in_flight"] == 0:
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.02)
        assert health["num_free_device_blocks"] == health["num_device_blocks"]


def test_a_refused_prompt_fails_its_batch_at_once():
    """One running slot (busy with a long request) and one waiting slot: prompt "b" of a
    batch is refused at once (429); the answer does not wait for prompt "a" to start,
    and "a" is aborted instead of holding the waiting slot."""
    import threading

    with BackgroundServer(
        sim_engine(step_s=0.02, max_model_len=MAX_MODEL_LEN, max_num_seqs=1, max_waiting=1),
        HashTokenizer(4096),
    ) as server:
        long_done = threading.Event()

        def long_request():
            client = HttpClient(server.url)
            client.post_json(
                "/v1/completions",
                {"model": MODEL, "prompt": "x", "max_tokens": 120, "ignore_eos": True},
            )
            client.close()
            long_done.set()

        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + 5
        while server.health()["num_running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        client = HttpClient(server.url)
        status, _, body = client.post_json(
            "/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 4}
        )
        client.close()
        assert status == 429, body
        assert not long_done.is_set()  # answered while the long request still runs
        deadline = time.monotonic() + 5
        while server.health()["num_waiting"]:  # "a" was aborted, not left waiting
            assert time.monotonic() < deadline, server.health()
            time.sleep(0.02)
        thread.join(30)
