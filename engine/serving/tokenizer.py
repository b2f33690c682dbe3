"""Tokenizers: a deterministic word-hash tokenizer (default) and a Hugging Face wrapper.

The bundled model's weights are random, so its tokens mean nothing; what matters for a
scheduler benchmark is that a prompt's token count is predictable. `HashTokenizer`
maps each whitespace-separated word to one id, so a prompt of N words is N tokens.
:func:`export_hf_tokenizer` writes a Hugging Face tokenizer that counts the same, for
load generators that count tokens on their side.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
NUM_SPECIAL_TOKENS = 3
SPECIAL_TOKENS = {PAD_TOKEN_ID: "<pad>", BOS_TOKEN_ID: "<s>", EOS_TOKEN_ID: "</s>"}
UNK_TOKEN = "<unk>"

#: Python's ``str.split()`` also splits on the ASCII separators FS, GS, RS and US
#: (U+001C..U+001F), which are not Unicode White_Space; Hugging Face's WhitespaceSplit
#: (Rust's ``char::is_whitespace``) keeps them inside words. Words are split on
#: White_Space only, so an exported tokenizer counts exactly as this one does.
_NOT_WHITE_SPACE = ("\x1c", "\x1d", "\x1e", "\x1f")
_WORD = re.compile("[^\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def split_words(text: str) -> list[str]:
    """``text`` split on Unicode White_Space (``str.split()`` but for U+001C..U+001F)."""
    if any(c in text for c in _NOT_WHITE_SPACE):
        return _WORD.findall(text)
    return text.split()  # the fast path: the same split for every other text


@runtime_checkable
class Tokenizer(Protocol):
    eos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HashTokenizer:
    """One id per whitespace-separated word: `3 + blake2b(word) mod (vocab_size - 3)`,
    except a pseudo-word `w<i>` (what id `i` decodes to, for an id of the vocabulary
    that is no special id), which is `i`.

    Ids are stable across processes and machines (no salted `hash()`); ids 0, 1, 2
    (pad, bos, eos) are never produced for words. Id `i` decodes to the pseudo-word
    `w<i>`, joined by single spaces, and special ids decode to nothing unless
    `skip_special_tokens=False`; so encoding a decoded text gives its ids back (but the
    special ones), as a real tokenizer mostly does: the answer a chat client sends back
    in its next turn is the tokens the model generated, and the prefix cache finds them.
    Decoding is prefix-stable (`decode(ids[:n])` is a prefix of `decode(ids)`), so
    streamed text deltas can be cut from successive decodes.
    """

    def __init__(self, vocab_size: int, eos_token_id: int = EOS_TOKEN_ID) -> None:
        if vocab_size <= NUM_SPECIAL_TOKENS:
            raise ValueError(f"vocab_size must be > {NUM_SPECIAL_TOKENS}, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def token_id(self, word: str) -> int:
        if word[:1] == "w" and word[1:].isdigit() and word[1:2] != "0":
            i = int(word[1:])  # a decoded id (`decode`'s pseudo-word) is its own id
            if NUM_SPECIAL_TOKENS <= i < self.vocab_size:
                return i
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        return NUM_SPECIAL_TOKENS + int.from_bytes(digest, "little") % (
            self.vocab_size - NUM_SPECIAL_TOKENS
        )

    def encode(self, text: str) -> list[int]:
        return [self.token_id(word) for word in split_words(text)]

    def tokenize(self, text: str) -> list[str]:
        """The piece of ``text`` each id of ``encode(text)`` stands for: its words."""
        return split_words(text)

    def num_tokens_lower_bound(self, text: str) -> int:
        """The exact count of ``encode(text)``, without hashing a word: the server
        refuses an over-long prompt by it before paying for tokenization."""
        return len(split_words(text))

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
        self.path = Path(path)
        self._tokenizer = _HFTokenizer.from_file(str(path))
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = EOS_TOKEN_ID if eos_token_id is None else eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def tokenize(self, text: str) -> list[str]:
        """The token strings of ``encode(text)`` (``convert_ids_to_tokens``)."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(
    model_dir: str | Path | None, vocab_size: int, eos_token_id: int | None = None
) -> Tokenizer:
    """`HFTokenizer` when `model_dir` holds a `tokenizer.json`, else `HashTokenizer`.

    A checkpoint directory without `tokenizer.json` (such as one written by
    `engine.worker.weights.save_checkpoint`) gets the hash tokenizer over its vocabulary. The
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


def export_hf_tokenizer(tokenizer: Tokenizer, out_dir: str | Path) -> Path:
    """Write ``out_dir/tokenizer.json`` (plus ``tokenizer_config.json`` and
    ``special_tokens_map.json``, for ``transformers.AutoTokenizer``) that counts tokens
    exactly as ``tokenizer`` does; returns the ``tokenizer.json`` path.

    An :class:`HFTokenizer`'s file is copied as it is (with the config files beside it,
    when there are). A :class:`HashTokenizer` becomes a WordLevel tokenizer with a
    WhitespaceSplit pre-tokenizer: every word is one token, so every count is the
    same. Its ids are not the server's: a word-level vocabulary cannot hash, so every
    word of a prompt is ``<unk>`` (id ``vocab_size``). The vocabulary holds the special
    tokens (ids 0-2) and the pseudo-words ``w3 ... w<vocab_size - 1>`` the server
    decodes to, so the server's output text encodes back to the server's ids. The
    special tokens are plain vocabulary entries, not added tokens: an added token is
    matched anywhere in the text, so ``a</s>b`` would be three tokens, not one word.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if isinstance(tokenizer, HFTokenizer):
        shutil.copyfile(tokenizer.path, path)
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            source = tokenizer.path.parent / name
            if source.is_file():
                shutil.copyfile(source, out / name)
        if not (out / "tokenizer_config.json").is_file():
            (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return path
    if not isinstance(tokenizer, HashTokenizer):
        raise TypeError(
            f"cannot export a {type(tokenizer).__name__}: expected a HashTokenizer "
            "or an HFTokenizer"
        )
    from tokenizers import Tokenizer as _HFTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {text: i for i, text in SPECIAL_TOKENS.items()}
    vocab.update((f"w{i}", i) for i in range(NUM_SPECIAL_TOKENS, tokenizer.vocab_size))
    vocab[UNK_TOKEN] = tokenizer.vocab_size
    hf = _HFTokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.save(str(path))
    special = {
        "bos_token": SPECIAL_TOKENS[BOS_TOKEN_ID],
        "pad_token": SPECIAL_TOKENS[PAD_TOKEN_ID],
        "eos_token": SPECIAL_TOKENS.get(tokenizer.eos_token_id, f"w{tokenizer.eos_token_id}"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps({**config, **special}, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return path
