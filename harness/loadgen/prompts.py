"""Prompts of exact lengths, on any OpenAI-compatible server.

- ``token_ids`` (completions, the default): the prompt is a list of token ids, so a
  target of 512 prompt tokens is 512 on the server whatever its tokenizer. Ids are
  consecutive from a per-request offset (crc32 of the request id) within
  ``[lo, hi)``, after two leading ids drawn from a 64-bit hash of the request id, so
  two requests share no prefix (one pair in ``(hi - lo)**2`` could: a prefix cache gets
  no free hits; with only the offset, one pair in 2,000 had the same prompt).
- ``tokenize``: a text prompt (chat, or completions with ``--prompt-mode text``) of
  common English words, sized with the server's ``POST /tokenize`` so that the
  server's count for the rendered prompt (the chat template included) is the target:
  a linear fit from two probes, then checked and corrected once per distinct length.
- ``estimate``: no /tokenize on the server: one token per word, no template overhead.

The record says which method sized the prompt (``prompt_method``) beside the server's
own count (``server_prompt_tokens``, from usage).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable

from harness.profiles.prompt_layout import salted

# Common words that are one token each (with their leading space) in GPT-style BPE
# vocabularies, and exactly one token each with schedscope's hash tokenizer.
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there had one all we can their has been if "
    "more when will would who so no out up into do any time about other than then them"
).split()

DEFAULT_ID_RANGE = (1000, 3000)


def leading_digits(request_id: str, base: int, count: int) -> list[int]:
    """``count`` digits in ``base`` of a 64-bit hash of ``request_id``: what a prompt
    begins with so that no two requests' prompts share a prefix (barring one pair in
    ``base**count``)."""
    value = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
    digits = []
    for _ in range(count):
        value, digit = divmod(value, base)
        digits.append(digit)
    return digits


def token_ids(
    request_id: str, n: int, lo: int = DEFAULT_ID_RANGE[0], hi: int = DEFAULT_ID_RANGE[1]
) -> list[int]:
    span = hi - lo
    start = zlib.crc32(request_id.encode())
    ids = [lo + (start + j) % span for j in range(n)]
    lead = leading_digits(request_id, span, min(2, n))
    ids[: len(lead)] = [lo + digit for digit in lead]
    return ids


def words(request_id: str, m: int) -> str:
    """``m`` words: three drawn from the request id's hash (no shared prefix), then
    consecutive ones from its crc32."""
    start = zlib.crc32(request_id.encode())
    k = len(WORDS)
    chosen = [WORDS[(start + j) % k] for j in range(m)]
    lead = leading_digits(request_id, k, min(3, m))
    chosen[: len(lead)] = [WORDS[digit] for digit in lead]
    return " ".join(chosen)


def chat_messages(content: str, system: str | None = None) -> list[dict]:
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def segment_ids(segments: list[tuple[str, int]], salt: str, lo: int, hi: int) -> list[int]:
    """Token ids of a prompt laid out in ``segments`` (harness/profiles/prompt_layout.py):
    each segment's own ids, keyed by its (salted) key."""
    ids: list[int] = []
    for key, n in segments:
        ids += token_ids(salted(key, salt), n, lo, hi)
    return ids


def segment_words(key: str, salt: str, m: int) -> str:
    """``m`` words of segment ``key`` (salted): the same words wherever the key appears."""
    return words(salted(key, salt), m)


class TextSizer:
    """Words per target length for text prompts.

    ``count(text) -> int | None`` asks the server how many prompt tokens a request with
    that text has (None: the server has no /tokenize). ``chat`` says whether the text
    goes into a chat message (the count then includes the template's tokens).
    """

    def __init__(self, count: Callable[[str], int | None] | None) -> None:
        self._count = count
        self._fit: tuple[float, float] | None = None  # overhead, tokens per word
        self._words: dict[int, int] = {}
        self.method = "estimate"
        if count is not None:
            a, b = count(words("probe", 64)), count(words("probe", 128))
            if a is not None and b is not None and b > a:
                per_word = (b - a) / 64
                self._fit = (a - 64 * per_word, per_word)
                self.method = "tokenize"

    def num_words(self, target: int) -> int:
        """Words whose rendered prompt the server counts as ``target`` tokens (as near
        as it can: a chat template's overhead is a floor)."""
        count = self._count
        if self._fit is None or count is None:  # a fit is made only with a count
            return max(target, 0)
        cached = self._words.get(target)
        if cached is not None:
            return cached
        overhead, per_word = self._fit
        m = max(0, round((target - overhead) / per_word))
        for _ in range(4):
            got = count(words("probe", m))
            if got is None or got == target:
                break
            step = round((target - got) / per_word) or (1 if target > got else -1)
            if m + step < 0:
                break
            m += step
        self._words[target] = m
        return m

    def text(self, request_id: str, target: int) -> str:
        return words(request_id, self.num_words(target))

    def segment_num_words(self, tokens: int) -> int:
        """Words for a part of a prompt of ``tokens`` tokens (a system prompt, a chat
        message): the fit's tokens per word, without a template's overhead (the part is
        not a whole prompt); one word per token without a fit."""
        if self._fit is None:
            return max(tokens, 0)
        return max(0, round(tokens / self._fit[1]))
