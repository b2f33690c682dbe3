from __future__ import annotations

import builtins
import json
import subprocess
import sys

import pytest

from engine.serving.tokenizer import (
    EOS_TOKEN_ID,
    NUM_SPECIAL_TOKENS,
    HashTokenizer,
    HFTokenizer,
    Tokenizer,
    load_tokenizer,
)
from tests.support.paths import REPO

REPO = REPO


def test_ids_are_stable_hard_coded():
    # blake2b(word, digest_size=8) as a little-endian int, mod (vocab - 3), plus 3.
    assert HashTokenizer(4096).encode("hello world") == [2505, 608]
    assert HashTokenizer(32000).encode("hello world") == [13012, 4515]


def test_ids_are_stable_across_processes():
    code = (
        "from engine.serving.tokenizer import HashTokenizer; "
        "print(HashTokenizer(4096).encode('a b c'))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)},
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {f"{HashTokenizer(4096).encode('a b c')}\n"}


def test_token_count_is_word_count():
    tokenizer = HashTokenizer(4096)
    text = "  the quick\tbrown fox\n\njumps  over the lazy dog  "
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.split()) == 9
    assert ids[0] == ids[6]  # same word, same id
    assert tokenizer.encode("") == []
    assert tokenizer.encode("Hello") != tokenizer.encode("hello")


def test_special_ids_never_produced_for_words():
    tokenizer = HashTokenizer(8)  # 5 word ids: every one is hit many times
    ids = tokenizer.encode(" ".join(f"word{i}" for i in range(2000)))
    assert set(ids) == set(range(NUM_SPECIAL_TOKENS, 8))


def test_decode_is_pseudo_words_and_prefix_stable():
    tokenizer = HashTokenizer(4096)
    assert tokenizer.decode([2505, 608]) == "w2505 w608"
    assert tokenizer.decode([17, EOS_TOKEN_ID, 0]) == "w17"
    assert tokenizer.decode([17, EOS_TOKEN_ID], skip_special_tokens=False) == "w17 </s>"
    ids = [5, 900, 33, 4000]
    for n in range(len(ids)):
        assert tokenizer.decode(ids).startswith(tokenizer.decode(ids[:n]))
    # round trip through the pseudo-words is stable (not the original text)
    assert tokenizer.encode(tokenizer.decode(ids)) == tokenizer.encode("w5 w900 w33 w4000")


def test_protocol_and_validation():
    tokenizer = HashTokenizer(100, eos_token_id=2)
    assert isinstance(tokenizer, Tokenizer)
    assert (tokenizer.vocab_size, tokenizer.eos_token_id) == (100, 2)
    with pytest.raises(ValueError, match="vocab_size must be > 3"):
        HashTokenizer(3)


def test_load_tokenizer_without_tokenizer_json_is_hash(tmp_path):
    assert isinstance(load_tokenizer(None, 4096), HashTokenizer)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    tokenizer = load_tokenizer(tmp_path, 4096)
    assert isinstance(tokenizer, HashTokenizer) and tokenizer.eos_token_id == 7


def test_hf_tokenizer_missing_package_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers":
            raise ImportError("No module named 'tokenizers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(ImportError, match="needs the `tokenizers` package"):
        load_tokenizer(tmp_path, 4096)


def test_hf_tokenizer_round_trip(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "[UNK]": 5}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(tmp_path, 100)
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.encode("hello world") == [3, 4]
    assert tokenizer.decode([3, 4]) == "hello world"
    assert tokenizer.vocab_size == 6
