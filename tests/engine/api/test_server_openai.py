"""The server against the official ``openai`` client (and raw HTTP for the SSE bytes).

One live in-process server (sim executor, 0.5 ms steps) on 127.0.0.1 for the module.
The hash tokenizer makes counts exact: a prompt of N words is N tokens, and the sim
executor never emits EOS, so with ``ignore_eos`` a completion is exactly max_tokens.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from engine.api.protocol import ServingContext, parse_generate_request
from engine.serving.tokenizer import HashTokenizer
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

MODEL = "tiny"
MAX_MODEL_LEN = 256
TOKENIZER = HashTokenizer(4096)
FILLER_TEXT = "w3"  # the sim executor's placeholder token (id 3), decoded


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(
        sim_engine(step_s=0.0005, max_model_len=MAX_MODEL_LEN), TOKENIZER
    ) as live:
        yield live
        assert live.health()["num_unfinished"] == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_usage_request_id_and_finish_reason(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL,
        prompt="the quick brown fox jumps",
        max_tokens=7,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-Id": "client-req-1"},
    )
    assert raw.headers["x-request-id"] == "client-req-1"
    completion = raw.parse()
    assert completion.id == "client-req-1"
    assert completion.object == "text_completion"
    assert completion.model == MODEL
    assert completion.usage.prompt_tokens == 5
    assert completion.usage.completion_tokens == 7
    assert completion.usage.total_tokens == 12
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].text == " ".join([FILLER_TEXT] * 7)


def test_generated_request_id_is_echoed(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=1)
    assert raw.headers["x-request-id"].startswith("cmpl-")
    assert raw.parse().id == raw.headers["x-request-id"]


def test_completion_stream_with_usage(client):
    stream = client.completions.create(
        model=MODEL,
        prompt="one two three",
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Request-Id": "stream-1"},
    )
    chunks = list(stream)
    assert {c.id for c in chunks} == {"stream-1"}
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == " ".join([FILLER_TEXT] * 9)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (3, 9)
    assert all(c.usage is None for c in chunks[:-1])


def test_default_max_tokens_fills_the_context(client):
    completion = client.completions.create(model=MODEL, prompt="a b c")
    assert completion.usage.completion_tokens == MAX_MODEL_LEN - 3
    assert completion.choices[0].finish_reason == "length"


def test_prompt_as_token_ids(client):
    completion = client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=2)
    assert completion.usage.prompt_tokens == 4


def test_chat_completion(client):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there friend"},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=4,
        extra_headers={"X-Request-Id": "chat-1"},
    )
    chat = raw.parse()
    assert chat.id == "chat-1" and raw.headers["x-request-id"] == "chat-1"
    assert chat.object == "chat.completion"
    # "<|system|> be brief\n<|user|> hello there friend\n<|assistant|>": 3 + 4 + 1 words
    assert chat.usage.prompt_tokens == 8
    assert chat.usage.completion_tokens == 4
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == " ".join([FILLER_TEXT] * 4)
    assert chat.choices[0].finish_reason == "length"


def test_chat_stream(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == " ".join([FILLER_TEXT] * 5)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == 3


def test_stop_token_ids_and_min_tokens(client):
    completion = client.completions.create(
        model=MODEL,
        prompt="x",
        max_tokens=10,
        extra_body={"stop_token_ids": [3], "min_tokens": 2, "priority": 3, "top_k": 5},
        temperature=0.5,
        top_p=0.9,
        seed=7,
    )
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens == 2


def test_bad_requests_raise_openai_errors(client):
    with pytest.raises(openai.BadRequestError, match="one token"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, stop=["two words"])
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=2)
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-nope", prompt="x", max_tokens=2)
    assert info.value.code == "model_not_found"


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_stop_strings_map_to_single_tokens():
    ctx = ServingContext((MODEL,), MAX_MODEL_LEN, TOKENIZER)
    req = parse_generate_request(
        {
            "model": MODEL,
            "prompt": "a",
            "max_tokens": 3,
            "stop": ["hello", "end"],
            "stop_token_ids": [9],
        },
        "completion",
        ctx,
    )
    hello, end = TOKENIZER.token_id("hello"), TOKENIZER.token_id("end")
    assert req.params.stop_token_ids == (9, hello, end)
    assert req.stop_string_token_ids == {hello, end}


def test_sse_bytes_are_openai_format(server):
    async def run() -> tuple[aiohttp.ClientResponse, bytes]:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                server.url + "/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": "a b",
                    "max_tokens": 4,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                headers={"X-Request-Id": "sse-1"},
            ) as response:
                return response, await response.read()

    response, body = asyncio.run(run())
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["X-Request-Id"] == "sse-1"
    assert body.endswith(b"\n\ndata: [DONE]\n\n")
    events = body.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    payloads = [json.loads(e[len(b"data: ") :]) for e in events[:-2]]
    assert all(e.startswith(b"data: {") and b"\n" not in e for e in events[:-2])
    assert {p["id"] for p in payloads} == {"sse-1"}
    assert len(payloads) == 4 + 1 + 1  # 4 tokens, the finish chunk, the usage chunk
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 4


def test_health_and_version(server):
    http = HttpClient(server.url)
    status, headers, body = http.request("GET", "/health")
    health = json.loads(body)
    assert status == 200 and health["state"] == "running" and health["status"] == "ok"
    for key in (
        "num_running",
        "num_waiting",
        "num_swapped",
        "num_in_flight",
        "num_steps",
        "num_free_device_blocks",
        "num_device_blocks",
        "num_free_host_blocks",
        "num_host_blocks",
        "num_failed_requests",
        "num_engine_errors",
    ):
        assert isinstance(health[key], int), key
    assert health["num_device_blocks"] == 4096
    status, _, body = http.request("GET", "/version")
    assert status == 200 and isinstance(json.loads(body)["version"], str)
    http.close()


def test_usage_says_the_prompt_tokens_found_in_the_prefix_cache(client):
    """As OpenAI and vLLM: ``usage.prompt_tokens_details.cached_tokens``. A prompt of 40
    token ids, then one sharing its first 32 (two blocks of 16): the second finds them
    cached, non-streamed and streamed (its final usage chunk) alike."""
    shared = [1000 + i for i in range(32)]
    first = client.completions.create(
        model=MODEL, prompt=shared + [7] * 8, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.completions.create(
        model=MODEL, prompt=shared + [9] * 8, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert second.usage.prompt_tokens == 40
    assert second.usage.prompt_tokens_details.cached_tokens == 32
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=shared + [11] * 8,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details.cached_tokens == 32
