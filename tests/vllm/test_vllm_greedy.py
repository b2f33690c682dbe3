"""Served by both engines with greedy sampling, the same checkpoint gives the same
completion tokens for a set of prompts — or the first divergence is a near-tie: the two
tokens' logits (recomputed densely by the bundled model, float32) differ by less than
``NEAR_TIE`` of the largest logit. The margin is printed either way.

vLLM's token ids come from its logprobs (``return_tokens_as_token_ids``); the bundled
engine has no logprobs, so its ids are read back from its text: the checkpoint's
tokenizer is word-level, one token per whitespace-separated word
(tests/support/vllm_checkpoint.py), special tokens (decoded as nothing) aside.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.worker.dense_reference import dense_reference_forward
from engine.worker.weights import load_checkpoint
from harness.serve.local_server import CliServer, HttpClient
from tests.support.vllm_server import MAX_MODEL_LEN, SERVED_MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_PROMPTS = 8
MAX_TOKENS = 32
NEAR_TIE = 1e-4
SPECIAL_IDS = {0, 1, 2}


def greedy_body(prompt: list[int]) -> dict:
    return {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


def vllm_ids(server, prompt: list[int]) -> list[int]:
    body = greedy_body(prompt) | {"logprobs": 1, "return_tokens_as_token_ids": True}
    choice = server.post("/v1/completions", body)["choices"][0]
    return [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]


def bundled_words(url: str, prompt: list[int]) -> list[str]:
    client = HttpClient(url)
    try:
        status, _, raw = client.post_json("/v1/completions", greedy_body(prompt))
    finally:
        client.close()
    assert status == 200, raw
    return json.loads(raw)["choices"][0]["text"].split()


def first_divergence(ids: list[int], words: list[str], vocabulary: list[str]):
    """(position in ``ids``, vLLM's id, ours) of the first difference, or None."""
    index = {w: i for i, w in enumerate(vocabulary)}
    ours = iter(words)
    for position, token in enumerate(ids):
        if token in SPECIAL_IDS:
            continue  # decoded as nothing by both
        word = next(ours, None)
        if word != vocabulary[token]:
            return position, token, index.get(word)
    return None


def test_both_engines_serve_the_same_greedy_tokens(vllm_server, vllm_checkpoints):
    model_dir = vllm_checkpoints / "served"
    vocabulary = json.loads((vllm_checkpoints / "vocabulary.json").read_text())
    rng = np.random.default_rng(11)
    prompts = [
        rng.integers(3, len(vocabulary), int(n)).tolist() for n in rng.integers(3, 60, NUM_PROMPTS)
    ]
    theirs = [vllm_ids(vllm_server, p) for p in prompts]
    args = [
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
    ]
    with CliServer(args, start_timeout_s=180) as bundled:
        ours = [bundled_words(bundled.url, p) for p in prompts]

    model, _ = load_checkpoint(model_dir)
    same, near_ties = 0, []
    for prompt, ids, words in zip(prompts, theirs, ours, strict=True):
        assert len(ids) == MAX_TOKENS
        divergence = first_divergence(ids, words, vocabulary)
        if divergence is None:
            same += 1
            continue
        position, their_token, our_token = divergence
        assert our_token is not None, f"the bundled engine's text has an unknown word: {words}"
        with torch.inference_mode():
            logits = dense_reference_forward(model, torch.tensor(prompt + ids[:position]))[-1]
        margin = float((logits[their_token] - logits[our_token]).abs() / logits.abs().max())
        near_ties.append(margin)
        assert margin < NEAR_TIE, (
            f"prompt {prompt[:8]}...: token {position} is {their_token} on vLLM, {our_token} "
            f"here, {margin:.2e} of the largest logit apart: not a near-tie"
        )
    print(f"greedy: {same}/{len(prompts)} identical, near-tie margins {near_ties}")
    assert same >= len(prompts) // 2, near_ties  # near-ties are the exception
