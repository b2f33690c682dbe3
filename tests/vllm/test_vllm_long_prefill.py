"""vLLM 0.32's ``--long-prefill-token-threshold``, held to vLLM itself: a long prompt that
arrives while another request decodes is cut into the same chunks by a real vLLM and by
the bundled engine; alone, each computes it in one step.

vLLM's chunks are read from its KV cache events (``--kv-events-config``, ZMQ): the engine
publishes one batch per step, and each ``BlockStored`` event names the blocks the step
filled with their token ids. So the long prompt's full blocks per step are vLLM's chunks
at block granularity. The bundled engine (``serve --executor sim``: the chunks are the
scheduler's) records its steps (``--record-steps``): the same blocks per step follow
from its prefill tokens. Both run with one block size (128, vLLM CPU's own), the same token
budget and threshold.

The schedule: a decoding request A (8 prompt tokens, 400 out), and once A has streamed
its first token, a long prompt B (4.5 thresholds, one token out), its ids its own (no
prefix-cache hit); then B alone.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request

import msgpack
import polars as pl
import pytest
import zmq

from harness.serve.local_server import CliServer
from tests.support.ports import free_port
from tests.support.vllm_server import SERVED_MODEL_NAME, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCK_SIZE = 128  # vLLM's CPU backend's own default, given explicitly
THRESHOLD = 2 * BLOCK_SIZE
BUDGET = 2048
LONG = 4 * THRESHOLD + THRESHOLD // 2  # beside A: chunks of 256, 256, 256, 256, 128


@pytest.fixture(scope="module")
def events_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def capped_vllm(vllm_python_path, vllm_checkpoints, events_port):
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{events_port}",
        "topic": "kv",
    }
    args = (
        "--block-size",
        str(BLOCK_SIZE),
        "--long-prefill-token-threshold",
        str(THRESHOLD),
        "--max-num-batched-tokens",
        str(BUDGET),
        "--kv-events-config",
        json.dumps(kv_events),
    )
    with VllmServer(vllm_python_path, vllm_checkpoints / "served", extra_args=args) as server:
        yield server


def block_size_of(url: str) -> int:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    line = next(li for li in text.splitlines() if li.startswith("vllm:cache_config_info{"))
    return int(dict(re.findall(r'(\w+)="([^"]*)"', line))["block_size"])


def _post(url: str, body: dict, first_token: threading.Event | None = None) -> None:
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if first_token is not None and line.startswith(b"data: {"):
                first_token.set()


def send_schedule(url: str, long_prompt: list[int], beside_a_decode: bool) -> None:
    """B (``long_prompt``, one token out), sent once A streams (``beside_a_decode``) or
    alone; returns when both have ended."""
    a_thread = None
    if beside_a_decode:
        first = threading.Event()
        body_a = {
            "model": SERVED_MODEL_NAME,
            "prompt": [7] * 8,
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
        a_thread = threading.Thread(target=_post, args=(url, body_a, first), daemon=True)
        a_thread.start()
        assert first.wait(120), "A never streamed"
    _post(url, {"model": SERVED_MODEL_NAME, "prompt": long_prompt, "max_tokens": 1})
    if a_thread is not None:
        a_thread.join(120)
        assert not a_thread.is_alive()


def long_prompt(offset: int) -> list[int]:
    """B's token ids: a walk through ids 100..999 (period 900) from ``offset``."""
    return [100 + (offset + 7 * i) % 900 for i in range(LONG)]


class KvEvents:
    """A subscriber to vLLM's KV cache events: per published batch (one per engine
    step), the ``BlockStored`` events' token ids. It binds the loopback port and vLLM's
    publisher connects to it (vLLM binds only wildcard endpoints)."""

    def __init__(self, port: int) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv")
        self.socket.bind(f"tcp://127.0.0.1:{port}")

    def drain(self, quiet_ms: int = 1500) -> list[list[list[int]]]:
        """Every batch received until none comes for ``quiet_ms``."""
        batches = []
        while self.socket.poll(quiet_ms):
            _topic, _seq, payload = self.socket.recv_multipart()
            ts_events = msgpack.unpackb(payload, strict_map_key=False)
            batches.append(
                [
                    event["token_ids"]
                    for event in ts_events[1]
                    if isinstance(event, dict) and event.get("type") == "BlockStored"
                ]
            )
        return batches

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def vllm_blocks_per_step(batches: list[list[list[int]]], prompt: list[int], size: int) -> list[int]:
    """Per step that stored some of ``prompt``'s blocks, how many."""
    starts = {tuple(prompt[i : i + size]): i for i in range(0, len(prompt) - size + 1, size)}
    counts = []
    for batch in batches:
        stored = 0
        for tokens in batch:
            start = starts.get(tuple(tokens[:size]))
            if start is not None and tokens == prompt[start : start + len(tokens)]:
                stored += len(tokens) // size
        if stored:
            counts.append(stored)
    return counts


def blocks_per_step(chunks: list[int], size: int) -> list[int]:
    """The full blocks each chunk completes (the ones that complete some)."""
    counts, done = [], 0
    for chunk in chunks:
        full = (done + chunk) // size - done // size
        done += chunk
        if full:
            counts.append(full)
    return counts


def test_vllm_and_the_bundled_engine_cut_a_long_prompt_into_the_same_chunks(
    capped_vllm, events_port, tmp_path
):
    size = block_size_of(capped_vllm.url)
    assert size == BLOCK_SIZE
    beside, alone = long_prompt(0), long_prompt(450)
    events = KvEvents(events_port)
    try:
        events.drain(quiet_ms=1500)  # vLLM's publisher reconnects (ZMQ's slow joiner)
        send_schedule(capped_vllm.url, beside, beside_a_decode=True)
        send_schedule(capped_vllm.url, alone, beside_a_decode=False)
        batches = events.drain()
    finally:
        events.close()
    vllm_beside = vllm_blocks_per_step(batches, beside, size)
    vllm_alone = vllm_blocks_per_step(batches, alone, size)

    steps_file = tmp_path / "steps.parquet"
    args = [
        "--executor", "sim",
        "--served-model-name", SERVED_MODEL_NAME,
        "--block-size", str(size),
        "--max-model-len", "4096",
        "--max-num-seqs", "4",
        "--max-num-batched-tokens", str(BUDGET),
        "--long-prefill-token-threshold", str(THRESHOLD),
        "--record-steps", str(steps_file),
    ]  # fmt: skip
    with CliServer(args) as server:
        send_schedule(server.url, beside, beside_a_decode=True)
        send_schedule(server.url, alone, beside_a_decode=False)
    prefills = pl.read_parquet(steps_file).filter(pl.col("num_prefill_tokens") > 0)
    # B's chunks: the steps that prefill while A decodes
    ours_chunks = prefills.filter(pl.col("num_decode_seqs") == 1)["num_prefill_tokens"].to_list()
    assert ours_chunks == [256, 256, 256, 256, 128]
    # the steps that prefill with nothing decoding: A's prompt, then B's alone
    ours_alone = prefills.filter(pl.col("num_decode_seqs") == 0)["num_prefill_tokens"].to_list()
    assert ours_alone == [8, LONG]
    ours_alone = ours_alone[1:]

    assert vllm_beside == blocks_per_step(ours_chunks, size), (vllm_beside, size)
    assert vllm_alone == blocks_per_step(ours_alone, size) == [LONG // size], (vllm_alone, size)
