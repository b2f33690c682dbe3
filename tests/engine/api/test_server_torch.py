"""`schedscope serve` with the real torch executor (the default), via the official client.

The bundled tiny model on the CPU, random weights from a seed: the tokens mean nothing,
but greedy decoding is deterministic, seeded sampling reproducible, and the counts exact.
"""

from __future__ import annotations

import json

import openai
import pytest

from harness.serve.local_server import CliServer, HttpClient

pytestmark = [pytest.mark.torch_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def server():
    with CliServer(
        ["--max-num-seqs", "8", "--swap-space", "0.01", "--device-memory", "0.25"],
        start_timeout_s=120,
    ) as live:
        yield live
        assert "device blocks" in live.output()  # the KV pool sizes are printed at start-up


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_greedy_completion_is_deterministic_and_counted(client):
    prompt = "the quick brown fox jumps over the lazy dog"
    first = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    second = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert first.usage.prompt_tokens == 9
    assert first.usage.completion_tokens == 12
    assert first.choices[0].finish_reason == "length"
    assert first.choices[0].text == second.choices[0].text
    assert first.choices[0].text.strip()


def test_streaming_matches_non_streaming(client):
    prompt = "one two three four five"
    whole = (
        client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=10,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
    )
    pieces = [
        chunk.choices[0].text
        for chunk in client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=10,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        if chunk.choices
    ]
    assert "".join(pieces) == whole


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(
        model="tiny",
        max_tokens=10,
        temperature=1.0,
        top_p=0.95,
        seed=1234,
        extra_body={"ignore_eos": True},
    )
    a = client.chat.completions.create(
        messages=[{"role": "user", "content": "hello there"}], **kwargs
    )
    b = client.chat.completions.create(
        messages=[{"role": "user", "content": "hello there"}], **kwargs
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == 10


def test_health_reports_no_leaked_blocks_when_idle(server):
    status, _, body = HttpClient(server.url).request("GET", "/health")
    health = json.loads(body)
    assert status == 200 and health["state"] == "running"
    assert health["num_unfinished"] == 0
    assert health["num_free_device_blocks"] == health["num_device_blocks"] > 0
    assert health["num_free_host_blocks"] == health["num_host_blocks"]
