"""The checkpoints' tokenizer (tests/support/vllm_checkpoint.py) keeps its promises: the
load generator's prompt words are each one token, the vocabulary probe's rare words close
the vocabulary, and the bundled engine loads every variant with that tokenizer."""

from __future__ import annotations

import json

import pytest

from engine.serving.tokenizer import HFTokenizer
from harness.loadgen.prompt_choice import PROBE_TEXT
from harness.loadgen.prompts import WORDS
from harness.serve.server import tokenizer_for
from tests.support import vllm_checkpoint

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_copied_prompt_words_are_the_load_generators():
    assert vllm_checkpoint.PROMPT_WORDS == WORDS


def test_the_tokenizer_counts_one_token_per_word_and_shows_the_whole_vocabulary(
    vllm_checkpoints,
):
    vocabulary = json.loads((vllm_checkpoints / "vocabulary.json").read_text())
    assert len(vocabulary) == vllm_checkpoint.VOCAB_SIZE == len(set(vocabulary))
    for variant in vllm_checkpoint.VARIANTS:
        tokenizer = tokenizer_for(str(vllm_checkpoints / variant))
        assert isinstance(tokenizer, HFTokenizer)
        assert tokenizer.vocab_size == len(vocabulary)
        assert tokenizer.encode(" ".join(WORDS)) == [vocabulary.index(w) for w in WORDS]
        # the probe's largest id is the vocabulary's last: auto's bound is its size
        assert max(tokenizer.encode(PROBE_TEXT)) == len(vocabulary) - 1
        ids = list(range(3, 40))
        assert tokenizer.encode(tokenizer.decode(ids)) == ids  # injective decoding
