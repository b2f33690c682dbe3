"""A small Llama-architecture decoder (RMSNorm, RoPE, GQA, SwiGLU) over a paged KV cache.

Module and parameter names follow Hugging Face's `LlamaForCausalLM`, so a checkpoint's
state dict loads as is (see `engine.worker.weights`). Weights are random from `config.seed` by
default: the tokens mean nothing, the compute is real.

KV cache contract (shared with the model runner and the block manager's block ids): per
layer one K and one V tensor, each `[num_blocks, block_size, num_kv_heads, head_dim]`.
Token `i` of block `b` lives at flat slot `b * block_size + i`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.core.prefill_groups import group_prefill_chunks
from engine.worker.model_config import ModelConfig, RopeScaling

KVCache = list[tuple[Tensor, Tensor]]
# attend(q [T, H, hd], k [T, KVH, hd], v [T, KVH, hd]) -> [T, H, hd]
AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]

INIT_STD = 0.02
# Decode sequences are grouped by context length so that short ones are not padded to
# the longest; a group costs about as much fixed overhead as this many padded slots.
DECODE_GROUP_OVERHEAD_SLOTS = 1024


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    pin_memory: bool = False,
) -> KVCache:
    """Per layer (K, V), each `[num_blocks, block_size, num_kv_heads, head_dim]`, zeroed.

    `pin_memory` (for a host swap pool) takes effect only where CUDA is available.
    """
    pin = pin_memory and torch.cuda.is_available()
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    dtype = dtype or config.torch_dtype
    return [
        tuple(torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin) for _ in "kv")
        for _ in range(config.num_layers)
    ]


# ---- attention metadata -------------------------------------------------------------------


@dataclass
class DecodeMetadata:
    """A group of sequences with one new token each, of similar context lengths."""

    token_indices: Tensor | None  # [Sd] flat token index of each; None = all tokens, in order
    context_slots: Tensor  # [Sd, Ld] flat cache slot of each context position (padded)
    attn_bias: Tensor  # [Sd, Ld] float32: 0 where position < seq_len, -inf otherwise


@dataclass
class PrefillMetadata:
    """A group of sequences with several new tokens (prefill chunks), padded to the
    group's longest chunk and context (``engine.core.prefill_groups`` forms the groups)."""

    token_indices: Tensor  # [Tp] flat token index of each of their tokens
    padded_indices: Tensor  # [Tp] index into the [Sp * max_query_len] padded query layout
    max_query_len: int
    context_slots: Tensor  # [Sp, Lp] flat cache slot of each context position (padded)
    attn_bias: Tensor  # [Sp, max_query_len, Lp] float32: 0 where key_pos <= query_pos, else -inf


@dataclass
class AttentionMetadata:
    """Where a step's new tokens go in the paged cache and what each attends to.

    Build it with `AttentionMetadata.build` from Python lists. Sequences are
    concatenated in the flat input: sequence `s` owns tokens
    `query_start_loc[s]:query_start_loc[s + 1]`, which sit at the end of its context.
    """

    slot_mapping: Tensor  # [T] flat slot (block_id * block_size + offset) of each new token
    query_start_loc: Tensor  # [S + 1] cumulative starts of each sequence's new tokens
    seq_lens: Tensor  # [S] context length including this step's new tokens
    block_tables: Tensor  # [S, max_blocks] padded with 0 (masked)
    logits_indices: Tensor  # [K] flat token indices whose logits forward() returns
    block_size: int
    max_query_len: int
    max_seq_len: int
    is_decode_only: bool
    decode: list[DecodeMetadata]  # sequences with query_len 1, grouped by context length
    prefill: list[PrefillMetadata]  # sequences with query_len > 1, grouped by size

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str = "cpu",
        logits_for: Sequence[bool] | None = None,
    ) -> tuple[AttentionMetadata, Tensor]:
        """Metadata and the positions `[T]` of the new tokens (`seq_len - query_len + i`).

        `block_tables[s]` must cover `seq_lens[s]` tokens (extra blocks are ignored);
        `logits_for[s]` asks for the logits of sequence `s`'s last new token (default: all).
        """
        num_seqs = len(query_lens)
        if not (len(seq_lens) == len(block_tables) == num_seqs) or num_seqs == 0:
            raise ValueError("query_lens, seq_lens and block_tables need one entry per sequence")
        q_lens = np.asarray(query_lens, dtype=np.int64)
        s_lens = np.asarray(seq_lens, dtype=np.int64)
        if (q_lens < 1).any() or (q_lens > s_lens).any():
            raise ValueError(f"need 1 <= query_len <= seq_len, got {query_lens} / {seq_lens}")
        num_blocks_needed = -(-s_lens // block_size)
        for s, table in enumerate(block_tables):
            if len(table) < num_blocks_needed[s]:
                raise ValueError(
                    f"sequence {s}: block table has {len(table)} blocks, "
                    f"{num_blocks_needed[s]} needed for {s_lens[s]} tokens of block_size {block_size}"
                )
        max_blocks = int(num_blocks_needed.max())
        tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)
        for s, table in enumerate(block_tables):
            n = num_blocks_needed[s]
            tables[s, :n] = table[:n]

        starts = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(q_lens, out=starts[1:])
        num_tokens = int(starts[-1])
        seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
        offset_in_query = np.arange(num_tokens) - starts[seq_of_token]
        positions = (s_lens - q_lens)[seq_of_token] + offset_in_query
        slot_mapping = (
            tables[seq_of_token, positions // block_size] * block_size + positions % block_size
        )

        if logits_for is None:
            logits_indices = starts[1:] - 1
        else:
            if len(logits_for) != num_seqs:
                raise ValueError("logits_for needs one entry per sequence")
            logits_indices = (starts[1:] - 1)[np.asarray(logits_for, dtype=bool)]

        def t(array: np.ndarray) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device)

        decode_mask = q_lens == 1
        is_decode_only = bool(decode_mask.all())
        decode, prefill = [], []
        decode_seqs = np.flatnonzero(decode_mask)
        groups = _group_by_length(num_blocks_needed[decode_seqs], block_size)
        for group in groups:
            seqs = decode_seqs[group]
            slots, query_pos = _context_slots(tables[seqs], s_lens[seqs], block_size)
            in_order = is_decode_only and len(groups) == 1  # the whole batch, in order
            decode.append(
                DecodeMetadata(
                    token_indices=None if in_order else t(starts[seqs]),
                    context_slots=t(slots),
                    attn_bias=_causal_bias(t(query_pos), slots.shape[1])[:, 0, :],
                )
            )
        prefill_seqs = np.flatnonzero(~decode_mask)
        prefill_groups = group_prefill_chunks(
            q_lens[prefill_seqs].tolist(), s_lens[prefill_seqs].tolist()
        )
        for group in prefill_groups:
            seqs = prefill_seqs[group]
            p_lens = q_lens[seqs]
            max_q = int(p_lens.max())
            token_indices = np.concatenate([np.arange(starts[s], starts[s + 1]) for s in seqs])
            p_seq = np.repeat(np.arange(len(seqs)), p_lens)
            padded = p_seq * max_q + (token_indices - starts[seqs][p_seq])
            slots, query_pos = _context_slots(tables[seqs], s_lens[seqs], block_size, p_lens, max_q)
            prefill.append(
                PrefillMetadata(
                    token_indices=t(token_indices),
                    padded_indices=t(padded),
                    max_query_len=max_q,
                    context_slots=t(slots),
                    attn_bias=_causal_bias(t(query_pos), slots.shape[1]),
                )
            )
        metadata = cls(
            slot_mapping=t(slot_mapping),
            query_start_loc=t(starts),
            seq_lens=t(s_lens),
            block_tables=t(tables),
            logits_indices=t(logits_indices),
            block_size=block_size,
            max_query_len=int(q_lens.max()),
            max_seq_len=int(s_lens.max()),
            is_decode_only=is_decode_only,
            decode=decode,
            prefill=prefill,
        )
        return metadata, t(positions)


def _group_by_length(num_blocks: np.ndarray, block_size: int) -> list[np.ndarray]:
    """Indices of `num_blocks` split into groups of similar length.

    Power-of-two buckets of the block count, then neighbours merged whenever padding the
    shorter to the longer costs less than a group's fixed overhead.
    """
    if len(num_blocks) == 0:
        return []
    order = np.argsort(num_blocks, kind="stable")
    lengths = num_blocks[order]
    bucket = np.ceil(np.log2(lengths)).astype(np.int64)
    runs = np.split(np.arange(len(order)), np.flatnonzero(np.diff(bucket)) + 1)
    groups = [runs[0]]
    for run in runs[1:]:
        current = groups[-1]
        padded_apart = len(current) * lengths[current[-1]] + len(run) * lengths[run[-1]]
        padded_together = (len(current) + len(run)) * lengths[run[-1]]
        if (padded_together - padded_apart) * block_size <= DECODE_GROUP_OVERHEAD_SLOTS:
            groups[-1] = np.concatenate([current, run])
        else:
            groups.append(run)
    return [np.sort(order[g]) for g in groups]  # batch order within a group


def _context_slots(
    tables: np.ndarray,
    seq_lens: np.ndarray,
    block_size: int,
    query_lens: np.ndarray | None = None,
    max_query_len: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Flat slots `[S, L]` of each sequence's context and the query positions `[S, Q]`.

    Query row `i` of sequence `s` sits at position `seq_len - query_len + i`. Padding rows
    (i >= query_len) get position 0: they see key 0 only, so no row is fully masked (a
    fully masked softmax row would be NaN).
    """
    num_blocks = -(-int(seq_lens.max()) // block_size)
    tables = tables[:, :num_blocks]
    slots = (tables[:, :, None] * block_size + np.arange(block_size)).reshape(len(tables), -1)
    if query_lens is None:
        query_lens = np.ones_like(seq_lens)
    query_pos = (seq_lens - query_lens)[:, None] + np.arange(max_query_len)[None, :]
    query_pos = np.where(np.arange(max_query_len)[None, :] < query_lens[:, None], query_pos, 0)
    return slots, query_pos


def _causal_bias(query_pos: Tensor, num_keys: int) -> Tensor:
    """float32 `[S, Q, num_keys]`: 0 where key position <= query position, else -inf."""
    keys = torch.arange(num_keys, device=query_pos.device)
    visible = keys[None, None, :] <= query_pos[:, :, None]
    bias = torch.zeros(visible.shape, dtype=torch.float32, device=query_pos.device)
    return bias.masked_fill_(~visible, float("-inf"))


# ---- layers -------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:  # one fused op, same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 and cast back before scaling, as Hugging Face's LlamaRMSNorm.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> Tensor:
    """`[head_dim / 2]` float32 inverse frequencies, with `rope_scaling` applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is not None:
        inv_freq = _scale_inv_freq(inv_freq, scaling)
    return inv_freq


def _scale_inv_freq(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # "llama3": long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate `x [T, heads, head_dim]` by position; `cos`/`sin` are `[T, 1, head_dim / 2]`.

    Hugging Face's "rotate_half" convention: dimension `i` pairs with `i + head_dim / 2`.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = hd = config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, m, bias=False)
        self.up_proj = nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attend)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder. `forward` runs one engine step over the paged KV cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.scale = config.head_dim**-0.5
        self.workspace = Workspace()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin `[T, 1, head_dim / 2]` in the model's dtype (computed in float32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        dtype = self.lm_head.weight.dtype
        return freqs.cos()[:, None, :].to(dtype), freqs.sin()[:, None, :].to(dtype)

    def hidden_states(
        self, input_ids: Tensor, positions: Tensor, attend: Callable[[int], AttendFn]
    ) -> Tensor:
        """Final-normed hidden states `[T, hidden]`; `attend(layer_idx)` does attention."""
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rope(positions)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, attend(i))
        return self.model.norm(h)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: KVCache,
        attn_metadata: AttentionMetadata,
    ) -> Tensor:
        """input_ids, positions `[T]` -> float32 logits `[K, vocab]` at `logits_indices`.

        Writes the new tokens' K/V into `kv_caches` at `attn_metadata.slot_mapping`.
        """
        paged = PagedAttention(
            self.config,
            kv_caches,
            attn_metadata,
            self.scale,
            self.lm_head.weight.dtype,
            self.workspace,
        )
        h = self.hidden_states(input_ids, positions, paged.for_layer)
        return self.lm_head(h[attn_metadata.logits_indices]).float()


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
    ) -> None:
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
            # One bag of L rows per query head: [S, KVH, G, L] -> [S * H, L]
            v_bags = rows(decode.context_slots)[:, :, None, :].expand(num_seqs, kvh, g, length)
            self.decode_groups.append(
                _DecodeGroup(
                    token_indices=decode.token_indices,
                    k_rows=rows(decode.context_slots).flatten(),
                    v_bags=v_bags.reshape(num_seqs * kvh * g, length),
                    bias=decode.attn_bias.to(dtype)[:, None, None, :],
                )
            )
        self.prefill_groups = [
            _PrefillGroup(
                prefill,
                rows(prefill.context_slots).flatten(),
                prefill.attn_bias.to(dtype)[:, None, None, :, :],
            )
            for prefill in metadata.prefill
        ]

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
        for group in self.prefill_groups:
            idx = group.meta.token_indices
            out[idx] = self._prefill(q[idx], k_rows, v_rows, group)
        return out

    def _decode(self, q: Tensor, k_rows: Tensor, v_rows: Tensor, group: _DecodeGroup) -> Tensor:
        num_seqs = q.shape[0]
        kvh, g, hd = self.num_kv_heads, self.group, self.head_dim
        k = self.workspace.gather(k_rows, group.k_rows, 0).view(num_seqs, kvh, -1, hd)
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
    v_bags: Tensor  # [Sd * H, L] cache rows of the values, one bag per query head
    bias: Tensor  # [Sd, 1, 1, L] 0 / -inf


@dataclass
class _PrefillGroup:
    meta: PrefillMetadata
    rows: Tensor  # [Sp * KVH * Lp] cache rows of the context, ordered [S, KVH, L]
    bias: Tensor  # [Sp, 1, 1, Q, Lp] 0 / -inf


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


# ---- construction -------------------------------------------------------------------------


def build_model(config: ModelConfig, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A model with deterministic random weights from `config.seed`, in `config.dtype`.

    Weights are drawn on the CPU in float32, in parameter order, then cast and moved: the
    same seed gives the same weights on every device.
    """
    model = empty_model(config, device)
    generator = torch.Generator().manual_seed(config.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied lm_head is listed once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
    return model


def empty_model(config: ModelConfig, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A model with uninitialised weights in `config.dtype` on `device` (no init cost)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=config.torch_dtype).to_empty(device=device)
    model.tie_weights()  # to_empty() gives each module its own tensor
    model.inv_freq = rope_inv_freq(config).to(device)  # RoPE frequencies stay float32
    return model.requires_grad_(False).eval()  # inference only


# ---- reference paths (tests and benchmarks) -------------------------------------------------


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
