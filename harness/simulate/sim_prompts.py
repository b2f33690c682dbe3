"""The simulator's prompt tokens: the layout of ``harness.profiles.prompt_layout``
rendered cheaply (the simulated executor never reads a token's value, only the prefix
cache compares them).

A segment is its key's id then the filler id: ``[id(key)] + [FILLER] * (n - 1)`` (one
list multiplication, not a token per step of Python). A single-turn request's own
segment keeps the id it has always had (its phase and index above the filler), so a
profile without shared segments simulates exactly as before. A session turn is rendered
as the bundled engine's chat template renders messages, one role marker per message
(``SessionPrompts``).
"""

from __future__ import annotations

import hashlib

from harness.profiles import RequestSpec
from harness.profiles.prompt_layout import segments

#: The token every simulated prompt is mostly made of; its value changes nothing.
PROMPT_TOKEN_ID = 5
#: Segment ids: above every own id ((phase << 40) + index) and below the role markers.
_SEGMENT_BASE = 1 << 56
_SEGMENT_SPAN = 1 << 55
#: The chat template's role markers (one token each, as ``<|user|>`` is one word).
SYSTEM_MARK, USER_MARK, ASSISTANT_MARK = (1 << 60) + 1, (1 << 60) + 2, (1 << 60) + 3


def segment_id(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return _SEGMENT_BASE + int.from_bytes(digest, "big") % _SEGMENT_SPAN


def segment_tokens(key: str, n: int) -> list[int]:
    tokens = [PROMPT_TOKEN_ID] * n
    if n:
        tokens[0] = segment_id(key)
    return tokens


def own_tokens(spec: RequestSpec, n: int) -> list[int]:
    """A single-turn request's own content: its first id unique in the plan."""
    tokens = [PROMPT_TOKEN_ID] * n
    if n:
        tokens[0] = PROMPT_TOKEN_ID + 1 + (spec.phase << 40) + spec.index
    return tokens


def single_turn_prompt(spec: RequestSpec) -> list[int]:
    """A single-turn request's prompt: its shared segments, then its own content."""
    if not spec.shared:
        return own_tokens(spec, spec.prompt_tokens)
    prompt: list[int] = []
    for key, n in segments(spec):
        prompt += own_tokens(spec, n) if key == spec.request_id else segment_tokens(key, n)
    return prompt


def first_turn_prompt(spec: RequestSpec) -> list[int]:
    """A session's first turn: the system message (if any), the user's message, the
    assistant's cue."""
    prompt: list[int] = []
    for key, n in spec.shared:
        prompt += [SYSTEM_MARK, *segment_tokens(key, n)]
    return prompt + next_message(spec)


def next_message(spec: RequestSpec) -> list[int]:
    """A turn's new user message and the assistant's cue."""
    assert spec.message_tokens is not None, "a session turn"
    return [USER_MARK, *segment_tokens(spec.request_id, spec.message_tokens), ASSISTANT_MARK]


def later_turn_prompt(spec: RequestSpec, prompt: list[int], answer: list[int]) -> list[int]:
    """Turn ``spec``'s prompt after a turn whose prompt was ``prompt`` and whose answer
    was ``answer`` (the tokens the engine generated): the conversation so far, the
    answer, the new message."""
    return prompt + answer + next_message(spec)
