"""Streamed text: :class:`IncrementalDetokenizer` turns a growing list of generated token
ids into text deltas."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Text deltas from a growing token list, decoding only a short window each time
    (vLLM's prefix/read offsets): correct for any tokenizer whose decode is local, and
    holds text back while it ends in an incomplete UTF-8 character."""

    __slots__ = ("tokenizer", "ids", "prefix_offset", "read_offset")

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, new_ids: list[int]) -> str:
        ids = self.ids
        ids.extend(new_ids)
        decode = self.tokenizer.decode
        prefix_text = decode(ids[self.prefix_offset : self.read_offset])
        new_text = decode(ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(ids)
            return new_text[len(prefix_text) :]
        return ""
