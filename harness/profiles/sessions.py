"""Sessions: a request class whose arrivals are conversations, not single requests.

A session arrives open-loop (the phase's arrival process picks its class like any
request's), then sends its turns one after another: turn ``k + 1`` is sent a think time
after turn ``k``'s answer ended, and its prompt is the system prompt, every earlier
turn's message and the answer actually received, and the new message (chat messages:
``system``, then ``user`` / ``assistant`` pairs, then the new ``user`` message). The
class's ``prompt_tokens`` is each turn's new message, its ``output_tokens`` each turn's
answer. A turn that fails ends its session: the turns after it are not sent (their rows
say so), never retried silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.profiles.distributions import LengthDistribution, SecondsDistribution
from harness.profiles.errors import ProfileError

#: The most turns one session may have.
MAX_TURNS = 1000


@dataclass(frozen=True, kw_only=True)
class Sessions:
    """``turns``: turns per session; ``think_time_s``: the wait between an answer's
    last token and the next turn's send (0 for an agent's tool loop)."""

    turns: LengthDistribution
    think_time_s: SecondsDistribution

    def __post_init__(self) -> None:
        if not isinstance(self.turns, LengthDistribution):
            raise ProfileError(f"turns: expected a LengthDistribution, got {self.turns!r}")
        upper = self.turns.upper
        if upper is None or upper > MAX_TURNS:
            raise ProfileError(
                f"turns: set a `max` of at most {MAX_TURNS} turns per session "
                f"(got {self.turns.describe()})"
            )
        if not isinstance(self.think_time_s, SecondsDistribution):
            raise ProfileError(
                f"think_time_s: expected a SecondsDistribution, got {self.think_time_s!r}"
            )

    def describe(self) -> str:
        return (
            f"sessions of {self.turns.describe()} turns, think time {self.think_time_s.describe()}"
        )
