"""Attention over the paged KV cache for one step: decodes and prefill chunks, each in
their groups, reading K/V rows straight from the cache blocks.

Two implementations of the same arithmetic, chosen per model (`ATTENTION_IMPLS`):

- ``gather`` (the CPU's, and the reference): decode gathers K, multiplies, and sums the
  softmax-weighted V rows straight from the cache with ``embedding_bag``; prefill runs
  padded matmuls. Fastest on the CPU, where a fused kernel buys nothing.
- ``sdpa`` (CUDA's): K and V gathered once per group, then PyTorch's fused
  ``scaled_dot_product_attention`` (flash / memory-efficient kernels on CUDA) with the
  group's mask. The query heads that share a KV head are laid out as that head's
  query rows, so grouped-query attention needs no repeated K/V and no ``enable_gqa``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.worker.attention_metadata import AttentionMetadata, KVCache, PrefillMetadata
from engine.worker.model_config import ModelConfig

# attend(q [T, H, hd], k [T, KVH, hd], v [T, KVH, hd]) -> [T, H, hd]
AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]

ATTENTION_IMPLS = ("gather", "sdpa")


def default_attention_impl(device: torch.device) -> str:
    """``sdpa`` on CUDA, ``gather`` elsewhere (see the module docstring)."""
    return "sdpa" if device.type == "cuda" else "gather"


# ---- paged attention -----------------------------------------------------------------------


class PagedAttention:
    """One step's attention over the paged cache; index tensors are prepared once per step.

    The cache is read as rows of `head_dim` values: row `slot * num_kv_heads + kv_head`.
    Decode gathers K rows into a reused workspace ordered `[S, KVH, L, hd]` (the layout
    batched matmul wants, so no transpose copy) and never gathers V: `embedding_bag`
    sums the softmax-weighted V rows straight from the cache. Query heads sharing a KV
    head form the rows of one matmul against that head's keys (GQA without repeats).
    """

    def __init__(
        self,
        config: ModelConfig,
        kv_caches: KVCache,
        metadata: AttentionMetadata,
        scale: float,
        dtype: torch.dtype,
        workspace: Workspace,
        impl: str = "gather",
    ) -> None:
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
        self.sdpa = impl == "sdpa"
        self.kv_caches = kv_caches
        self.metadata = metadata
        self.scale = scale
        self.workspace = workspace
        self.num_kv_heads = kvh = config.num_kv_heads
        self.group = g = config.num_queries_per_kv
        self.head_dim = config.head_dim
        kv_head = torch.arange(kvh, device=metadata.slot_mapping.device)

        def rows(slots: Tensor) -> Tensor:  # [S, L] slots -> [S, KVH, L] cache rows
            return slots[:, None, :] * kvh + kv_head[None, :, None]

        self.decode_groups = []
        for decode in metadata.decode:
            num_seqs, length = decode.context_slots.shape
            v_bags = None
            if not self.sdpa:  # one bag of L rows per query head: [S, KVH, G, L] -> [S * H, L]
                v_bags = rows(decode.context_slots)[:, :, None, :].expand(num_seqs, kvh, g, length)
                v_bags = v_bags.reshape(num_seqs * kvh * g, length)
            self.decode_groups.append(
                _DecodeGroup(
                    token_indices=decode.token_indices,
                    k_rows=rows(decode.context_slots).flatten(),
                    v_bags=v_bags,
                    bias=decode.attn_bias.to(dtype)[:, None, None, :],
                )
            )
        self.prefill_groups = []
        for prefill in metadata.prefill:
            bias = prefill.attn_bias.to(dtype)[:, None, None, :, :]
            if self.sdpa:  # the mask of each query row: [S, 1, G * Q, Lp]
                num_seqs, max_q, length = prefill.attn_bias.shape
                bias = bias.expand(num_seqs, 1, g, max_q, length)
                bias = bias.reshape(num_seqs, 1, g * max_q, length)
            self.prefill_groups.append(
                _PrefillGroup(prefill, rows(prefill.context_slots).flatten(), bias)
            )

    def for_layer(self, layer_idx: int) -> AttendFn:
        k_cache, v_cache = self.kv_caches[layer_idx]

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return self.attend(q, k, v, k_cache, v_cache)

        return attend

    def attend(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """q `[T, H, hd]`, k/v `[T, KVH, hd]` of the new tokens -> `[T, H, hd]`."""
        meta = self.metadata
        kvh, hd = self.num_kv_heads, self.head_dim
        k_cache.view(-1, kvh, hd).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, kvh, hd).index_copy_(0, meta.slot_mapping, v)
        k_rows, v_rows = k_cache.view(-1, hd), v_cache.view(-1, hd)
        groups = self.decode_groups
        if len(groups) == 1 and groups[0].token_indices is None:  # decode-only, one group
            return self._decode(q, k_rows, v_rows, groups[0])
        out = torch.empty_like(q)
        for group in groups:
            idx = group.token_indices
            out[idx] = self._decode(q[idx], k_rows, v_rows, group)
        for prefill_group in self.prefill_groups:
            idx = prefill_group.meta.token_indices
            out[idx] = self._prefill(q[idx], k_rows, v_rows, prefill_group)
        return out

    def _decode(self, q: Tensor, k_rows: Tensor, v_rows: Tensor, group: _DecodeGroup) -> Tensor:
        num_seqs = q.shape[0]
        kvh, g, hd = self.num_kv_heads, self.group, self.head_dim
        k = self.workspace.gather(k_rows, group.k_rows, 0).view(num_seqs, kvh, -1, hd)
        if group.v_bags is None:  # sdpa: a KV head's G query heads are its G query rows
            v = self.workspace.gather(v_rows, group.k_rows, 1).view(num_seqs, kvh, -1, hd)
            out = F.scaled_dot_product_attention(
                q.view(num_seqs, kvh, g, hd), k, v, attn_mask=group.bias, scale=self.scale
            )
            return out.reshape(num_seqs, kvh * g, hd)
        scores = torch.matmul(q.view(num_seqs, kvh, g, hd), k.transpose(-1, -2))
        probs = _softmax(scores.mul_(self.scale).add_(group.bias))
        out = F.embedding_bag(
            group.v_bags, v_rows, mode="sum", per_sample_weights=probs.view(group.v_bags.shape)
        )
        return out.view(num_seqs, kvh * g, hd)

    def _prefill(self, q: Tensor, k_rows: Tensor, v_rows: Tensor, group: _PrefillGroup) -> Tensor:
        prefill = group.meta
        num_seqs, max_q = prefill.context_slots.shape[0], prefill.max_query_len
        kvh, g, hd = self.num_kv_heads, self.group, self.head_dim
        padded = q.new_zeros(num_seqs * max_q, kvh * g, hd)
        padded[prefill.padded_indices] = q
        # [S, Q, KVH, G, hd] -> [S, KVH, G * Q, hd]
        qg = padded.view(num_seqs, max_q, kvh, g, hd).permute(0, 2, 3, 1, 4)
        qg = qg.reshape(num_seqs, kvh, g * max_q, hd)
        k = self.workspace.gather(k_rows, group.rows, 0).view(num_seqs, kvh, -1, hd)
        v = self.workspace.gather(v_rows, group.rows, 1).view(num_seqs, kvh, -1, hd)
        if self.sdpa:
            out = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.bias, scale=self.scale)
        else:
            scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(self.scale)
            scores = scores.view(num_seqs, kvh, g, max_q, -1).add_(group.bias)
            out = torch.matmul(_softmax(scores.view(num_seqs, kvh, g * max_q, -1)), v)
        # [S, KVH, G, Q, hd] -> [S * Q, H, hd]
        out = out.view(num_seqs, kvh, g, max_q, hd).permute(0, 3, 1, 2, 4)
        return out.reshape(-1, kvh * g, hd)[prefill.padded_indices]


def _softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dim in float32 (as Hugging Face's eager attention)."""
    return scores.softmax(-1, dtype=torch.float32).to(scores.dtype)


@dataclass
class _DecodeGroup:
    token_indices: Tensor | None  # [Sd] flat token indices; None = the whole batch, in order
    k_rows: Tensor  # [Sd * KVH * L] cache rows of the keys, ordered [S, KVH, L]
    v_bags: Tensor | None  # gather: [Sd * H, L] cache rows of the values, one bag per
    # query head; sdpa: None (V is gathered with k_rows)
    bias: Tensor  # [Sd, 1, 1, L] 0 / -inf


@dataclass
class _PrefillGroup:
    meta: PrefillMetadata
    rows: Tensor  # [Sp * KVH * Lp] cache rows of the context, ordered [S, KVH, L]
    bias: Tensor  # 0 / -inf; gather: [Sp, 1, 1, Q, Lp]; sdpa: [Sp, 1, G * Q, Lp]


class Workspace:
    """Reused buffers for gathered K/V rows.

    A fresh multi-megabyte tensor per layer costs page faults on the CPU that are as
    expensive as the gather itself; the model keeps one workspace and reuses it.
    """

    def __init__(self) -> None:
        self.buffers: dict[int, Tensor] = {}

    def gather(self, rows: Tensor, index: Tensor, slot: int) -> Tensor:
        """`rows[index]` (`[N, hd]`) written into buffer `slot`."""
        numel = index.shape[0] * rows.shape[1]
        buffer = self.buffers.get(slot)
        if (
            buffer is None
            or buffer.numel() < numel
            or buffer.dtype != rows.dtype
            or buffer.device != rows.device
        ):
            buffer = torch.empty(numel, dtype=rows.dtype, device=rows.device)
            self.buffers[slot] = buffer
        return torch.index_select(rows, 0, index, out=buffer[:numel].view(-1, rows.shape[1]))
