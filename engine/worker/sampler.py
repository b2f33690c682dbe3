"""Sampling the next token from a step's logits, per request's SamplingParams.

Greedy when ``temperature == 0``; otherwise temperature, then top-k, then top-p
(nucleus), then a draw — from the request's own generator when it set ``seed``, so a
seeded request gets the same tokens whatever else shares its batch. EOS and stop
tokens are masked until ``min_tokens`` tokens have been generated (vLLM's meaning).

Each row is sampled on its own: a row whose numbers break down (a temperature above
float32 range over banned tokens gives nan, a ``top_p`` that rounds to 0 in float32
keeps no token, a model that emits nan) yields an error for that row only, never an
exception, so one request's values cannot fail the other requests of its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.sequence import Sequence

_NEG_INF = float("-inf")


class SamplingError(Exception):
    """A row that cannot be sampled (its message is the request's error)."""


@dataclass(slots=True)
class SampleOutput:
    #: One entry per row: the sampled token id, or None where the row failed.
    token_ids: list[int | None]
    #: Row index -> why it failed ("sampling failed: ..."); empty when every row sampled.
    errors: dict[int, str] = field(default_factory=dict)


class Sampler:
    def __init__(self, eos_token_id: int | None) -> None:
        self.eos_token_id = eos_token_id

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleOutput:
        """logits ``[K, vocab]`` (float32), one row per sequence in ``seqs`` -> one
        token id or one error per row. Never raises for a row's numbers."""
        for row, seq in enumerate(seqs):
            params = seq.params
            if params.min_tokens and seq.num_tokens - seq.num_prompt_tokens < params.min_tokens:
                banned = list(params.stop_token_ids)
                if self.eos_token_id is not None:
                    banned.append(self.eos_token_id)
                if banned:
                    logits[row, banned] = _NEG_INF
        # argmax returns an index even for a row of nan or all -inf: look at the row's
        # largest logit (nan propagates through amax) to tell such a row from a real one.
        top = logits.amax(dim=-1)
        unusable = torch.isnan(top) | (top == _NEG_INF)
        # One device -> host copy for both (a synchronisation each on CUDA).
        greedy, unusable = torch.stack([logits.argmax(dim=-1), unusable.long()]).tolist()
        result: list[int | None] = greedy
        errors: dict[int, str] = {}
        for row, seq in enumerate(seqs):
            params = seq.params
            if params.temperature > 0 and params.top_k != 1:
                try:
                    result[row] = self._draw(logits[row], seq)
                except (SamplingError, RuntimeError, ValueError) as exc:
                    # RuntimeError/ValueError: whatever torch still refuses after the
                    # checks in _draw; it concerns this row alone.
                    result[row] = None
                    errors[row] = f"sampling failed: {exc}"
            elif unusable[row]:
                result[row] = None
                errors[row] = (
                    "sampling failed: the logits contain nan or every token is -inf (greedy)"
                )
        return SampleOutput(result, errors)

    def _draw(self, row: torch.Tensor, seq: Sequence) -> int:
        params = seq.params
        scores = row.float() / params.temperature
        if 0 < params.top_k < scores.shape[-1]:
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, _NEG_INF)
        probs = torch.softmax(scores, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            drop = cumulative - sorted_probs >= params.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs.cpu()
        # multinomial would raise on these; checked first so that the message names
        # the request's values, and so the request's generator is not advanced.
        if not bool(torch.isfinite(probs).all()):
            raise SamplingError(
                "probability tensor contains inf/nan "
                f"(temperature={params.temperature!r}, top_k={params.top_k}, "
                f"top_p={params.top_p!r})"
            )
        if not bool(probs.sum() > 0):
            raise SamplingError(
                "no token has positive probability "
                f"(temperature={params.temperature!r}, top_k={params.top_k}, "
                f"top_p={params.top_p!r})"
            )
        generator: torch.Generator | None = None
        if params.seed is not None:
            held = seq.generator
            if isinstance(held, torch.Generator):
                generator = held
            else:  # None: the request's first seeded draw
                generator = seq.generator = torch.Generator().manual_seed(params.seed)
        return int(torch.multinomial(probs, 1, generator=generator).item())
