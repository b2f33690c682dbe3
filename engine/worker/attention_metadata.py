"""The paged KV cache and one step's attention metadata.

KV cache contract (shared with the model runner and the block manager's block ids): per
layer one K and one V tensor, each `[num_blocks, block_size, num_kv_heads, head_dim]`.
Token `i` of block `b` lives at flat slot `b * block_size + i`. The metadata says, for
one step, where each new token's K/V goes and which cache slots each sequence attends
over: decodes grouped by context length, prefill chunks in groups of similar chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine.core.prefill_groups import group_prefill_chunks
from engine.worker.model_config import ModelConfig

KVCache = list[tuple[Tensor, Tensor]]

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

    def zeros() -> Tensor:
        return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

    return [(zeros(), zeros()) for _ in range(config.num_layers)]  # (K, V) per layer


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
                    f"{num_blocks_needed[s]} needed for {s_lens[s]} tokens "
                    f"of block_size {block_size}"
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
        for chunk_group in prefill_groups:
            seqs = prefill_seqs[chunk_group]
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
