"""Sampling the next token from a step's logits, per request's SamplingParams.

Greedy when ``temperature == 0``; otherwise temperature, then top-k, then top-p
(nucleus), then a draw — from the request's own generator when it set ``seed``, so a
seeded request gets the same tokens whatever else shares its batch. EOS and stop
tokens are masked until ``min_tokens`` tokens have been generated (vLLM's meaning).
"""

from __future__ import annotations

import torch

from engine.sequence import Sequence


class Sampler:
    def __init__(self, eos_token_id: int | None) -> None:
        self.eos_token_id = eos_token_id

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits ``[K, vocab]`` (float32), one row per sequence in ``seqs`` -> K ids."""
        for row, seq in enumerate(seqs):
            params = seq.params
            if params.min_tokens and seq.num_tokens - seq.num_prompt_tokens < params.min_tokens:
                banned = list(params.stop_token_ids)
                if self.eos_token_id is not None:
                    banned.append(self.eos_token_id)
                if banned:
                    logits[row, banned] = float("-inf")
        greedy = logits.argmax(dim=-1).tolist()
        result = greedy
        for row, seq in enumerate(seqs):
            params = seq.params
            if params.temperature > 0 and params.top_k != 1:
                result[row] = self._draw(logits[row], seq)
        return result

    def _draw(self, row: torch.Tensor, seq: Sequence) -> int:
        params = seq.params
        scores = row.float() / params.temperature
        if 0 < params.top_k < scores.shape[-1]:
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            drop = cumulative - sorted_probs >= params.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs.cpu()
        generator = None
        if params.seed is not None:
            if seq.generator is None:
                seq.generator = torch.Generator().manual_seed(params.seed)
            generator = seq.generator
        return int(torch.multinomial(probs, 1, generator=generator).item())
