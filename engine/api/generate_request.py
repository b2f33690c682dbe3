"""The validated request: what validation needs to know about the server
(:class:`ServingContext`) and what it hands on to the engine (:class:`GenerateRequest`,
one :class:`PromptChoice` per prompt)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.sampling_params import SamplingParams


@dataclass
class ServingContext:
    """What validation needs to know about the server."""

    served_model_names: tuple[str, ...]
    max_model_len: int
    tokenizer: Any  # engine.serving.tokenizer.Tokenizer


@dataclass
class PromptChoice:
    """One prompt of a request and its sampling parameters (a batched completion
    request has one per prompt; its ``choices`` carry the same indices)."""

    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class GenerateRequest:
    """A validated completion or chat request, ready for the engine."""

    kind: str  # "completion" | "chat"
    model: str
    choices: list[PromptChoice]
    priority: int = 0
    stream: bool = False
    include_usage: bool = False
    #: vLLM's ``stream_options.continuous_usage_stats``: usage on every chunk.
    continuous_usage: bool = False
    #: Token ids that came from ``stop`` strings: like OpenAI's stop sequences, their
    #: text is left out of the output.
    stop_string_token_ids: frozenset[int] = field(default_factory=frozenset)
    #: ``prompt`` was a list of prompts (even of one): the response is a batch.
    is_batch: bool = False
    #: The client set max_tokens (else it is whatever context each prompt leaves).
    max_tokens_given: bool = True
    #: A chat request's conversation turn: how many user messages it carries (0 for a
    #: completion, whose prompt says nothing of turns).
    turn: int = 0

    @property
    def prompt_token_ids(self) -> list[int]:
        """The first (for most requests, the only) prompt."""
        return self.choices[0].prompt_token_ids

    @property
    def params(self) -> SamplingParams:
        return self.choices[0].params

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(c.prompt_token_ids) for c in self.choices)
