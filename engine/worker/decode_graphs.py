"""Decode-only steps replayed from CUDA graphs, one graph per padded shape.

A decode step of a large model on a GPU launches a few hundred small kernels; at small
batches the launches, not the arithmetic, set its time. vLLM captures each decode
batch size into a CUDA graph once and replays it (its ``--enforce-eager`` turns that
off); this does the same for the bundled model.

A graph replays fixed addresses and fixed shapes, so a step is padded to a *shape*:
its batch rounded up to one of ``BATCH_SIZES`` and its longest context rounded up to a
power of two of blocks (at most ``max_context`` tokens). Padding rows read and write
only the *scratch block*, a block of the device pool that the block manager never
hands out (the runner allocates it past the last block); a row's context beyond its
own length is masked. Each shape is captured the first time a step needs it, after
two eager runs of that shape (CUDA's libraries set up their workspaces there, not
inside a capture). All graphs share one memory pool and one gather workspace, sized
for the largest shape when the first graph is captured: graphs replay one at a time
on one stream, so nothing they share is in use by two at once.

Without CUDA (or with ``capture=False``) the same padded buffers run eagerly: that is
what the CPU tests check against the unpadded step, and the reference on CUDA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from engine.worker.attention_metadata import AttentionMetadata, DecodeMetadata, KVCache
from engine.worker.model import LlamaForCausalLM
from engine.worker.model_config import ModelConfig
from engine.worker.paged_attention import Workspace

log = logging.getLogger("schedscope.engine")

#: Batch sizes a decode step is padded to (vLLM captures a similar ladder).
BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
#: The longest context a graph covers by default (vLLM's max_seq_len_to_capture).
MAX_GRAPH_CONTEXT = 8192


@dataclass
class _Shape:
    """The static buffers of one padded decode shape, and its graph once captured."""

    batch: int
    num_blocks: int  # context blocks per row
    input_ids: Tensor  # [B]
    positions: Tensor  # [B]
    metadata: AttentionMetadata  # slot_mapping [B]; one decode group [B, num_blocks * bs]
    hidden: Tensor | None = None  # [B, hidden] final-normed, written by each replay
    graph: torch.cuda.CUDAGraph | None = None


class DecodeGraphs:
    """Runs decode-only steps through padded shapes, captured as CUDA graphs when
    ``capture`` (CUDA only); see the module docstring."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: KVCache,
        block_size: int,
        scratch_block: int,
        max_batch: int,
        max_context: int,
        device: torch.device,
        capture: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.device = device
        self.capture = capture and device.type == "cuda"
        self.batch_sizes = padded_batch_sizes(max_batch)
        self.max_blocks = max(1, -(-max_context // block_size))
        self.shapes: dict[tuple[int, int], _Shape] = {}
        self.workspace = Workspace()
        self._pool: Any = None  # the graphs' shared memory pool
        self.num_replays = 0

    # -- which steps -----------------------------------------------------------------
    def shape_for(self, num_seqs: int, max_seq_len: int) -> tuple[int, int] | None:
        """The padded (batch, context blocks) of a decode step, or None when it is too
        large for any shape (it then runs eagerly)."""
        batch = next((b for b in self.batch_sizes if b >= num_seqs), None)
        blocks_needed = -(-max_seq_len // self.block_size)
        if batch is None or blocks_needed > self.max_blocks:
            return None
        blocks = min(1 << (blocks_needed - 1).bit_length(), self.max_blocks)
        return batch, blocks

    # -- running ---------------------------------------------------------------------
    def run(
        self, input_ids: list[int], seq_lens: list[int], block_tables: list[list[int]]
    ) -> Tensor | None:
        """float32 logits ``[S, vocab]`` of one decode-only step (one new token per
        sequence, at position ``seq_len - 1``), or None when no shape fits it."""
        key = self.shape_for(len(input_ids), max(seq_lens))
        if key is None:
            return None
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = self._prepare(*key)
        self._fill(shape, input_ids, seq_lens, block_tables)
        if shape.graph is not None:
            shape.graph.replay()
            self.num_replays += 1
        else:
            shape.hidden = self._forward(shape)
        assert shape.hidden is not None
        # The vocabulary projection runs eagerly, on the real rows only: captured, each
        # graph would keep a [batch, vocab] float32 output of its own.
        return self.model.logits(shape.hidden[: len(input_ids)])

    def _forward(self, shape: _Shape) -> Tensor:
        return self.model.last_hidden(
            shape.input_ids, shape.positions, self.kv_caches, shape.metadata, self.workspace
        )

    def capture_all(self) -> int:
        """Prepare (and capture, when ``capture``) every shape now, the largest first
        (its memory is then reused by the smaller ones); return how many there are.
        Serving calls this at warm-up, so that no request's step pays for a capture."""
        keys = [
            (batch, blocks)
            for batch in reversed(self.batch_sizes)
            for blocks in reversed(self._block_ladder())
        ]
        for key in keys:
            if key not in self.shapes:
                self.shapes[key] = self._prepare(*key)
        return len(keys)

    def _block_ladder(self) -> list[int]:
        """The context sizes in blocks a shape may have: powers of two, then the cap."""
        ladder, blocks = [], 1
        while blocks < self.max_blocks:
            ladder.append(blocks)
            blocks *= 2
        return [*ladder, self.max_blocks]

    def _fill(
        self,
        shape: _Shape,
        input_ids: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
    ) -> None:
        """Copy one step into the shape's buffers; padding rows use the scratch block."""
        bs, num_blocks = self.block_size, shape.num_blocks
        num_seqs = len(input_ids)
        tables = np.full((shape.batch, num_blocks), self.scratch_block, dtype=np.int64)
        positions = np.zeros(shape.batch, dtype=np.int64)
        for s, (seq_len, table) in enumerate(zip(seq_lens, block_tables, strict=True)):
            n = -(-seq_len // bs)
            tables[s, :n] = table[:n]
            positions[s] = seq_len - 1
        ids = np.zeros(shape.batch, dtype=np.int64)
        ids[:num_seqs] = input_ids
        slots = tables[:, :, None] * bs + np.arange(bs)  # [B, blocks, bs]
        slot_mapping = slots.reshape(shape.batch, -1)[np.arange(shape.batch), positions]
        visible = np.arange(num_blocks * bs)[None, :] <= positions[:, None]
        bias = np.where(visible, 0.0, -np.inf).astype(np.float32)
        decode = shape.metadata.decode[0]
        for target, source in (
            (shape.input_ids, ids),
            (shape.positions, positions),
            (shape.metadata.slot_mapping, slot_mapping),
            (decode.context_slots, slots.reshape(shape.batch, -1)),
            (decode.attn_bias, bias),
        ):
            target.copy_(torch.from_numpy(source), non_blocking=False)

    # -- preparing and capturing -------------------------------------------------------
    def _prepare(self, batch: int, num_blocks: int) -> _Shape:
        """Buffers for one shape, filled with padding rows; captured when ``capture``."""
        device, length = self.device, num_blocks * self.block_size

        def zeros(*size: int, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        metadata = AttentionMetadata(
            slot_mapping=zeros(batch),
            query_start_loc=torch.arange(batch + 1, device=device),
            seq_lens=zeros(batch),
            block_tables=zeros(batch, num_blocks),
            logits_indices=torch.arange(batch, device=device),
            block_size=self.block_size,
            max_query_len=1,
            max_seq_len=length,
            is_decode_only=True,
            decode=[
                DecodeMetadata(
                    None, zeros(batch, length), zeros(batch, length, dtype=torch.float32)
                )
            ],
            prefill=[],
        )
        shape = _Shape(batch, num_blocks, zeros(batch), zeros(batch), metadata)
        self._fill(shape, [], [], [])  # every row padding: reads and writes the scratch block
        if self.capture:
            self._capture(shape)
        return shape

    def _reserve_workspace(self) -> None:
        """Allocate the shared gather workspace for the largest shape, outside any
        capture: a capture must find its buffers already there (an allocation inside
        one would belong to that graph)."""
        config = self.model.config
        numel = workspace_bytes(config, self.block_size, self.batch_sizes[-1], self.max_blocks)
        numel //= 2 * config.dtype_size  # per buffer (K, V), in elements
        for slot in (0, 1):
            buffer = self.workspace.buffers.get(slot)
            if buffer is None or buffer.numel() < numel:
                self.workspace.buffers[slot] = torch.empty(
                    numel, dtype=config.torch_dtype, device=self.device
                )

    def _capture(self, shape: _Shape) -> None:  # pragma: no cover - CUDA only
        self._reserve_workspace()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(2):  # library workspaces are set up here, not in the capture
                self._forward(shape)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            shape.hidden = self._forward(shape)
        self._pool = graph.pool()
        shape.graph = graph
        log.info(
            "CUDA graph captured: decode batch %d over %d tokens of context (%d graphs)",
            shape.batch,
            shape.num_blocks * self.block_size,
            len(self.shapes) + 1,
        )


def padded_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes decode steps are padded to: ``BATCH_SIZES`` below
    ``max_batch``, then the first that holds it."""
    below = tuple(b for b in BATCH_SIZES if b < max_batch)
    return below + (next((b for b in BATCH_SIZES if b >= max_batch), max_batch),)


def workspace_bytes(config: ModelConfig, block_size: int, max_batch: int, max_blocks: int) -> int:
    """Bytes of the graphs' gather workspace (K and V) for ``max_batch`` rows of
    ``max_blocks`` blocks: what serving with graphs reserves beside the KV pool."""
    rows = max_batch * config.num_kv_heads * max_blocks * block_size
    return 2 * rows * config.head_dim * config.dtype_size
