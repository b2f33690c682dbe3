"""Tokenizers: a deterministic word-hash tokenizer (default) and a Hugging Face wrapper.

The bundled model's weights are random, so its tokens mean nothing; what matters for a
scheduler benchmark is that a prompt's token count is predictable. `HashTokenizer`
maps each whitespace-separated word to one id, so a prompt of N words is N tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
NUM_SPECIAL_TOKENS = 3
SPECIAL_TOKENS = {PAD_TOKEN_ID: "<pad>", BOS_TOKEN_ID: "<s>", EOS_TOKEN_ID: "</s>"}


@runtime_checkable
class Tokenizer(Protocol):
    eos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HashTokenizer:
    """One id per whitespace-separated word: `3 + blake2b(word) mod (vocab_size - 3)`.

    Ids are stable across processes and machines (no salted `hash()`); ids 0, 1, 2
    (pad, bos, eos) are never produced for words. Decoding is NOT the inverse of
    encoding: id `i` decodes to the pseudo-word `w<i>`, joined by single spaces, and
    special ids decode to nothing unless `skip_special_tokens=False`. Decoding is
    prefix-stable (`decode(ids[:n])` is a prefix of `decode(ids)`), so streamed text
    deltas can be cut from successive decodes.
    """

    def __init__(self, vocab_size: int, eos_token_id: int = EOS_TOKEN_ID) -> None:
        if vocab_size <= NUM_SPECIAL_TOKENS:
            raise ValueError(f"vocab_size must be > {NUM_SPECIAL_TOKENS}, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def token_id(self, word: str) -> int:
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        return NUM_SPECIAL_TOKENS + int.from_bytes(digest, "little") % (
            self.vocab_size - NUM_SPECIAL_TOKENS
        )

    def encode(self, text: str) -> list[int]:
        return [self.token_id(word) for word in text.split()]

    def num_tokens_lower_bound(self, text: str) -> int:
        """The exact count of ``encode(text)``, without hashing a word: the server
        refuses an over-long prompt by it before paying for tokenization."""
        return len(text.split())

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        words = []
        for i in ids:
            i = int(i)
            if i < NUM_SPECIAL_TOKENS:
                if not skip_special_tokens:
                    words.append(SPECIAL_TOKENS[i])
            else:
                words.append(f"w{i}")
        return " ".join(words)


class HFTokenizer:
    """A Hugging Face `tokenizer.json`, through the optional `tokenizers` package."""

    def __init__(self, path: str | Path, eos_token_id: int | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError as e:
            raise ImportError(
                f"loading {path} needs the `tokenizers` package (pip install tokenizers); "
                "without it, use HashTokenizer"
            ) from e
        self._tokenizer = _HFTokenizer.from_file(str(path))
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = EOS_TOKEN_ID if eos_token_id is None else eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(
    model_dir: str | Path | None, vocab_size: int, eos_token_id: int | None = None
) -> Tokenizer:
    """`HFTokenizer` when `model_dir` holds a `tokenizer.json`, else `HashTokenizer`.

    A checkpoint directory without `tokenizer.json` (such as one written by
    `engine.weights.save_checkpoint`) gets the hash tokenizer over its vocabulary. The
    eos id comes from `eos_token_id`, else the directory's `config.json`, else 2.
    """
    if eos_token_id is None and model_dir is not None:
        eos_token_id = _eos_from_config(Path(model_dir) / "config.json")
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        tokenizer = HFTokenizer(Path(model_dir) / "tokenizer.json", eos_token_id)
        if tokenizer.vocab_size > vocab_size:
            raise ValueError(
                f"{model_dir}/tokenizer.json has {tokenizer.vocab_size} tokens, "
                f"more than the model's vocab_size {vocab_size}"
            )
        return tokenizer
    return HashTokenizer(vocab_size, EOS_TOKEN_ID if eos_token_id is None else eos_token_id)


def _eos_from_config(path: Path) -> int | None:
    if not path.is_file():
        return None
    eos = json.loads(path.read_text()).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos
