"""Copying KV blocks between the device pool and the host (swap) pool, one step's worth
at a time, through a staging buffer: pinned and asynchronous on CUDA.

Swap-out (device -> host): the blocks of every layer's K and V are gathered on the
device into one contiguous tensor, on the compute stream and before the step's forward
(which may refill those blocks). That tensor is copied into a pinned staging buffer on
a copy stream of its own, so the copy overlaps the forward; :meth:`SwapCopier.finish`
waits for it and scatters the staged blocks into the host pool. Swap-in (host ->
device): the host blocks are gathered into a pinned staging buffer on the CPU, copied
to the device without blocking, and scattered into the device pool on the compute
stream, which orders the forward after them.

On the CPU the same steps run synchronously (nothing to overlap, nothing to pin), so
the CPU tests exercise the gather, staging and deferred scatter that CUDA runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.worker.attention_metadata import KVCache


@dataclass
class _PendingSwapOut:
    staged: Tensor  # [2 * layers, n, block_size, kv_heads, head_dim] on the host
    host_blocks: Tensor  # [n] destination block ids in the host pool
    done: torch.cuda.Event | None  # recorded on the copy stream after the copy (CUDA)


class SwapCopier:
    """One step's block copies between ``device_cache`` and ``host_cache``.

    Call order per step: :meth:`swap_out`, :meth:`swap_in`, the forward, then
    :meth:`finish` before the host pool is read again (the next :meth:`swap_in` also
    finishes first). ``*_s`` attributes hold the seconds each added to the step.
    """

    def __init__(self, device_cache: KVCache, host_cache: KVCache, device: torch.device) -> None:
        self.device_cache = [t for layer in device_cache for t in layer]  # K0, V0, K1, ...
        self.host_cache = [t for layer in host_cache for t in layer]
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if self.is_cuda else None
        self._staging: dict[str, Tensor] = {}
        self._pending: list[_PendingSwapOut] = []
        self.swap_out_s = 0.0
        self.swap_in_s = 0.0

    def _staging_buffer(self, kind: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A reused host buffer of ``shape`` (pinned on CUDA), grown when too small."""
        numel = 1
        for n in shape:
            numel *= n
        buffer = self._staging.get(kind)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
            buffer = torch.empty(numel, dtype=dtype, pin_memory=self.is_cuda)
            self._staging[kind] = buffer
        return buffer[:numel].view(shape)

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        """Start copying device blocks to host blocks: (device id, host id) pairs."""
        self.swap_out_s = 0.0
        if not mapping:
            return
        self.finish()  # a step that failed before its finish() left its copies pending
        started = time.perf_counter()
        src = torch.tensor([s for s, _ in mapping], dtype=torch.long).to(self.device)
        dst = torch.tensor([d for _, d in mapping], dtype=torch.long)
        # [2 * layers, n, block_size, kv_heads, head_dim], gathered on the compute stream
        gathered = torch.stack([cache.index_select(0, src) for cache in self.device_cache])
        staged = self._staging_buffer("out", tuple(gathered.shape), gathered.dtype)
        done = None
        if self.copy_stream is not None:
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                staged.copy_(gathered, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.copy_stream)
            gathered.record_stream(self.copy_stream)  # not reused before the copy ends
        else:
            staged.copy_(gathered)
        self._pending.append(_PendingSwapOut(staged, dst, done))
        self.swap_out_s = time.perf_counter() - started

    def finish(self) -> None:
        """Wait for the swap-outs in flight and scatter them into the host pool; the
        time spent waiting and scattering is added to ``swap_out_s``."""
        if not self._pending:
            return
        started = time.perf_counter()
        for pending in self._pending:
            if pending.done is not None:
                pending.done.synchronize()
            for cache, blocks in zip(self.host_cache, pending.staged, strict=True):
                cache.index_copy_(0, pending.host_blocks, blocks)
        self._pending.clear()
        self.swap_out_s += time.perf_counter() - started

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        """Copy host blocks to device blocks: (host id, device id) pairs. The device
        pool is written on the compute stream, so the step's forward sees the blocks."""
        self.swap_in_s = 0.0
        if not mapping:
            return
        self.finish()  # a host block read here may be one a swap-out is still writing
        started = time.perf_counter()
        src = torch.tensor([s for s, _ in mapping], dtype=torch.long)
        dst = torch.tensor([d for _, d in mapping], dtype=torch.long).to(self.device)
        first = self.host_cache[0]
        shape = (len(self.host_cache), len(mapping), *first.shape[1:])
        staged = self._staging_buffer("in", shape, first.dtype)
        for cache, out in zip(self.host_cache, staged, strict=True):
            torch.index_select(cache, 0, src, out=out)
        blocks = staged.to(self.device, non_blocking=self.is_cuda)
        for cache, block in zip(self.device_cache, blocks, strict=True):
            cache.index_copy_(0, dst, block)
        if self.is_cuda:  # the staging buffer is reused next step: the copy must be done
            torch.cuda.current_stream(self.device).synchronize()
        self.swap_in_s = time.perf_counter() - started
