"""What a planned request's prompt is made of, for every sender: the load generator's
token ids and words (``harness.loadgen.prompts``) and the simulator's ids
(``harness.simulate.sim_prompts``) render the same layout.

A prompt is a list of *segments* ``(key, tokens)``: the spec's shared segments (a system
prompt, a reuse rung's document, a trace's hash block: the same content wherever the key
appears), then its own content, keyed by its request id (a session turn's new message).
A renderer gives each key a content of its own that depends on the key alone and whose
first ``n`` tokens are the same for every ``n`` (a shorter segment is a prefix of a
longer one of the same key), so prompts that share segments share a prefix token for
token, and prompts that do not share none.
"""

from __future__ import annotations

from harness.profiles.schedule import RequestSpec

Segment = tuple[str, int]


def segments(spec: RequestSpec) -> list[Segment]:
    """``spec``'s shared segments, then its own (none when it has no own tokens)."""
    own = spec.own_tokens
    parts = list(spec.shared)
    if own > 0:
        parts.append((spec.request_id, own))
    return parts


def salted(key: str, salt: str) -> str:
    """The content key of ``key`` in one run (``salt``: the run's id), so that two runs
    against one server do not find each other's prompts in its prefix cache."""
    return f"{salt}/{key}" if salt else key
