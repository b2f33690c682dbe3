"""Dense reference paths the paged model is checked and benchmarked against: a whole
sequence from scratch with plain causal attention, and a batched decode over a
contiguous (unpaged) K/V cache. Tests and benchmarks use them; serving never does."""

from __future__ import annotations

import torch
from torch import Tensor

from engine.worker.model import LlamaForCausalLM
from engine.worker.model_config import ModelConfig
from engine.worker.paged_attention import AttendFn


def dense_reference_forward(model: LlamaForCausalLM, token_ids: Tensor) -> Tensor:
    """Logits `[L, vocab]` (float32) of every position of one sequence, from scratch.

    Plain causal attention over the whole sequence, GQA by repeating K/V heads; shares
    only the weights (and RoPE) with the paged path.
    """
    config = model.config
    num_tokens = token_ids.shape[0]
    group = config.num_queries_per_kv
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=token_ids.device).tril()

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k = k.repeat_interleave(group, dim=1)  # [L, H, hd]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * model.scale
        scores = scores.masked_fill(~causal, float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)

    positions = torch.arange(num_tokens, device=token_ids.device)
    h = model.hidden_states(token_ids, positions, lambda _: attend)
    return model.lm_head(h).float()


class DenseKVCache:
    """Contiguous per-sequence K/V, `[S, KVH, max_len, hd]` per layer (no paging)."""

    def __init__(
        self,
        config: ModelConfig,
        num_seqs: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = (num_seqs, config.num_kv_heads, max_len, config.head_dim)
        dtype = dtype or config.torch_dtype
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]


def dense_decode_forward(
    model: LlamaForCausalLM, input_ids: Tensor, positions: Tensor, cache: DenseKVCache
) -> Tensor:
    """One decode step of `S` sequences (one token each) over a `DenseKVCache`.

    The baseline the paged decode path is measured against: same attention math, no
    gather. Returns float32 logits `[S, vocab]`.
    """
    config = model.config
    num_seqs = input_ids.shape[0]
    kvh, g, hd = config.num_kv_heads, config.num_queries_per_kv, config.head_dim
    seq_idx = torch.arange(num_seqs, device=input_ids.device)
    length = int(positions.max()) + 1
    visible = torch.arange(length, device=input_ids.device)[None, :] <= positions[:, None]
    bias = torch.zeros(visible.shape, dtype=model.lm_head.weight.dtype, device=input_ids.device)
    bias = bias.masked_fill_(~visible, float("-inf"))[:, None, None, :]

    def for_layer(i: int) -> AttendFn:
        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            cache.k[i][seq_idx, :, positions] = k
            cache.v[i][seq_idx, :, positions] = v
            keys, values = cache.k[i][:, :, :length], cache.v[i][:, :, :length]
            scores = torch.matmul(q.view(num_seqs, kvh, g, hd), keys.transpose(-1, -2))
            scores = scores.mul_(model.scale).add_(bias)
            return torch.matmul(scores.softmax(-1), values).view(num_seqs, -1, hd)

        return attend

    h = model.hidden_states(input_ids, positions, for_layer)
    return model.lm_head(h).float()
