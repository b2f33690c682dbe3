"""Shared system prompts: the K prompts a request class's requests (or sessions) begin
with, and how popular each is.

Prompt ``k`` of a class has one length for the whole profile (drawn once from the seed)
and one content (keyed by the profile, the class and ``k``), so every request that draws
it repeats the same prefix token for token and a prefix cache can serve it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.profiles.distributions import LengthDistribution
from harness.profiles.errors import ProfileError, check_int, check_number

POPULARITY_LAWS = ("uniform", "zipf")
#: The most system prompts one class may have (each is a prefix the plan keys by name).
MAX_SYSTEM_PROMPTS = 100_000


@dataclass(frozen=True, kw_only=True)
class SystemPrompts:
    """``count`` system prompts of ``tokens`` lengths; a request draws prompt ``k``
    (0-based) with probability proportional to 1 (``uniform``) or to ``1 / (k + 1)**s``
    (``zipf``, exponent ``zipf_s``): prompt 0 is the most popular."""

    count: int
    tokens: LengthDistribution
    popularity: str = "uniform"
    zipf_s: float = 1.0

    def __post_init__(self) -> None:
        check_int("count", self.count, minimum=1, maximum=MAX_SYSTEM_PROMPTS)
        if not isinstance(self.tokens, LengthDistribution):
            raise ProfileError(f"tokens: expected a LengthDistribution, got {self.tokens!r}")
        if self.popularity not in POPULARITY_LAWS:
            raise ProfileError(
                f"popularity: expected one of {', '.join(POPULARITY_LAWS)}, got {self.popularity!r}"
            )
        object.__setattr__(self, "zipf_s", check_number("zipf_s", self.zipf_s, positive=True))

    def probabilities(self) -> np.ndarray:
        """The chance of each prompt, shape (count,), summing to 1."""
        if self.popularity == "uniform":
            return np.full(self.count, 1.0 / self.count)
        weights = 1.0 / np.arange(1, self.count + 1, dtype=np.float64) ** self.zipf_s
        return weights / weights.sum()

    def choose(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` prompt numbers (int64, shape (n,)) under the popularity law."""
        cum = np.cumsum(self.probabilities())
        cum[-1] = 1.0  # rounding must not leave a draw past the last prompt
        return np.searchsorted(cum, rng.random(n), side="right").astype(np.int64)

    def describe(self) -> str:
        law = "uniform" if self.popularity == "uniform" else f"Zipf s={self.zipf_s:g}"
        return f"{self.count} system prompt(s), {law}, {self.tokens.describe()} tokens"
