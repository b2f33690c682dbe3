"""The torch executor: a SchedulerOutput in, sampled tokens and the step's time out.

Per step: copy the blocks the scheduler swapped out (device -> host) and in (host ->
device), in that order — a block freed by a swap-out may be refilled by a swap-in or a
new prefill in the same step; on CUDA the copy to the host overlaps the forward
(engine/worker/swap_copies.py) — then build the flat input of every scheduled
sequence's new tokens (prefill chunks and decodes in one forward), run the model over
the paged KV cache, and sample one token for each sequence that completed its
scheduled tokens. A row that cannot be sampled fails its own request only
(``StepResult.sample_errors``); an exception here fails the whole step.

The runner's process keeps freed host memory (engine/worker/host_memory.py): without that,
every prefill step page-faulted its activations in afresh.

Device-agnostic: CUDA when present (pinned staging for swaps, fused attention, a
synchronisation before the step's time is read), CPU otherwise. The CPU path runs in
this project's tests; benchmarks/gpu.sh runs them on CUDA (docs/execution.md says what
has run where).
"""

from __future__ import annotations

import logging
import time

import torch

from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence
from engine.executor import StepResult
from engine.worker.decode_graphs import MAX_GRAPH_CONTEXT, DecodeGraphs
from engine.worker.host_memory import retain_freed_host_memory
from engine.worker.model import AttentionMetadata, LlamaForCausalLM, allocate_kv_cache
from engine.worker.model_config import ModelConfig
from engine.worker.sampler import Sampler
from engine.worker.swap_copies import SwapCopier

log = logging.getLogger("schedscope.engine")

DECODE_GRAPH_MODES = ("off", "capture", "eager")


def _new_token_ids(seq: Sequence, start: int, end: int) -> list[int]:
    """Token ids [start, end) of ``seq`` without concatenating prompt and output."""
    num_prompt = seq.num_prompt_tokens
    if start >= num_prompt:
        return seq.output_token_ids[start - num_prompt : end - num_prompt]
    if end <= num_prompt:
        return seq.prompt_token_ids[start:end]
    return seq.prompt_token_ids[start:] + seq.output_token_ids[: end - num_prompt]


class ModelRunner:
    """Owns the model, the device KV pool and the host (swap) KV pool."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        model_config: ModelConfig,
        block_size: int,
        num_device_blocks: int,
        num_host_blocks: int,
        device: torch.device,
        decode_graphs: str = "off",
        max_num_seqs: int = 256,
        max_model_len: int = 2048,
    ) -> None:
        """``decode_graphs``: ``off`` (every step eager), ``capture`` (decode-only steps
        replay CUDA graphs; CUDA only) or ``eager`` (the same padded shapes run eagerly:
        the CPU's check of that path). With graphs the device pool has one block more
        than ``num_device_blocks``, the scratch block of the padding rows, which the
        block manager never sees."""
        if decode_graphs not in DECODE_GRAPH_MODES:
            raise ValueError(f"decode_graphs must be one of {DECODE_GRAPH_MODES}")
        self.model = model
        self.model_config = model_config
        self.block_size = block_size
        self.device = device
        self.is_cuda = device.type == "cuda"
        # Before the pools are allocated: a step's activations must not be page-faulted
        # in afresh every step (engine/worker/host_memory.py has the measurements).
        self.retains_host_memory = retain_freed_host_memory()
        scratch = 1 if decode_graphs != "off" else 0
        self.device_cache = allocate_kv_cache(
            model_config, num_device_blocks + scratch, block_size, device
        )
        # Pinned host memory lets device<->host copies run asynchronously on CUDA.
        self.host_cache = allocate_kv_cache(
            model_config, max(num_host_blocks, 0), block_size, "cpu", pin_memory=self.is_cuda
        )
        self.swaps = SwapCopier(self.device_cache, self.host_cache, device)
        self.decode_graphs = (
            None
            if decode_graphs == "off"
            else DecodeGraphs(
                model,
                self.device_cache,
                block_size,
                scratch_block=num_device_blocks,
                max_batch=max_num_seqs,
                max_context=min(max_model_len, MAX_GRAPH_CONTEXT),
                device=device,
                capture=decode_graphs == "capture",
            )
        )
        self.sampler = Sampler(model_config.eos_token_id)

    # -- swap ------------------------------------------------------------------------
    def copy_blocks(self, mapping: list[tuple[int, int]], to_host: bool) -> None:
        """Copy KV blocks between pools for every layer, (source, destination) ids, and
        wait until they are there (outside a step: tests and tools)."""
        if to_host:
            self.swaps.swap_out(mapping)
            self.swaps.finish()
        else:
            self.swaps.swap_in(mapping)

    def warm_up(self, num_tokens: int, num_seqs: int, context_len: int) -> float:
        """Run the two largest steps this engine can be given, before any request holds
        a block, and return the seconds they took: one prefill of ``num_tokens`` tokens
        in one sequence, and one decode of ``num_seqs`` sequences over ``context_len``
        tokens of context each.

        A process's first steps of a new largest size grow the host heap, and every
        page of that growth faults in on first touch. Measured served at the default
        profile's rate, that made a fresh server's first burst ~2x slower to admit than
        the same burst in a process that had run it before (its E2E p50 1.9x), and its
        first 1024-token prefill 0.30 s against 0.11 s a minute later. Paying it once
        at start-up takes that out of every measured run (vLLM's start-up profiling
        run does the same on the GPU).

        The scratch K/V written here is never read: a block's slots are written by the
        prefill of the sequence that is given it. The decode's sequences share one
        block table (reads only; their one new slot each is the same scratch slot).

        Both steps run twice: where one round's freed blocks lie in the heap varies
        from process to process, and after a single round about 1 fresh process in 16
        (1 in 4 on a loaded machine) still grew its heap by 3-28 MiB in the first real
        prefill; with two rounds and one malloc arena (host_memory.py), 1 in 34 on a
        loaded machine, by 3 MiB.

        With CUDA graphs, every decode shape is captured here too (DecodeGraphs)."""
        capacity = self.device_cache[0][0].shape[0] * self.block_size
        started = time.perf_counter()
        shapes = []
        if min(num_tokens, capacity) >= 1:
            n = min(num_tokens, capacity)
            shapes.append(([n], [n]))
        if num_seqs >= 1 and min(context_len, capacity) >= 1:
            n = min(context_len, capacity)
            shapes.append(([1] * num_seqs, [n] * num_seqs))
        if self.decode_graphs is not None and self.decode_graphs.capture:
            count = self.decode_graphs.capture_all()
            log.info("decode: %d CUDA graphs captured", count)
        for query_lens, seq_lens in shapes * 2:  # twice: see the docstring
            blocks = list(range(-(-max(seq_lens) // self.block_size)))
            metadata, positions = AttentionMetadata.build(
                query_lens,
                seq_lens,
                [blocks] * len(seq_lens),
                self.block_size,
                self.device,
                [True] * len(seq_lens),
            )
            tokens = torch.zeros(sum(query_lens), dtype=torch.long).to(self.device)
            with torch.inference_mode():
                self.model(tokens, positions, self.device_cache, metadata)
            self._synchronize()
        return time.perf_counter() - started

    def _synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    # -- the step ------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepResult:
        started = time.perf_counter()
        # Swap-outs first (their blocks are gathered before anything refills them; the
        # copy to the host overlaps the forward on CUDA), then swap-ins.
        self.swaps.swap_out(out.blocks_to_swap_out)
        self.swaps.swap_in(out.blocks_to_swap_in)
        seqs = out.seqs
        if not seqs:
            self.swaps.finish()
            swaps = self.swaps
            return StepResult([], time.perf_counter() - started, swaps.swap_out_s, swaps.swap_in_s)
        swap_start_s = self.swaps.swap_out_s + self.swaps.swap_in_s

        input_ids: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        samples: list[bool] = []
        for seq in seqs:
            start = seq.num_computed_tokens
            end = start + seq.num_scheduled_tokens
            input_ids.extend(_new_token_ids(seq, start, end))
            query_lens.append(end - start)
            seq_lens.append(end)
            samples.append(end == seq.num_tokens)
        sampled: list[int | None] = [None] * len(seqs)
        logits = None
        if self.decode_graphs is not None and max(query_lens) == 1 and all(samples):
            tables = [seq.block_table for seq in seqs]
            logits = self.decode_graphs.run(input_ids, seq_lens, tables)
        if logits is None:  # not decode-only, or larger than any graph's shape
            # Logits only for sequences that sample (none for partial prefill chunks).
            metadata, positions = AttentionMetadata.build(
                query_lens,
                seq_lens,
                [seq.block_table for seq in seqs],
                self.block_size,
                self.device,
                samples,
            )
            tokens = torch.tensor(input_ids, dtype=torch.long).to(
                self.device, non_blocking=self.is_cuda
            )
            logits = self.model(tokens, positions, self.device_cache, metadata)
        self._synchronize()
        forward_done = time.perf_counter()
        forward_s = forward_done - started - swap_start_s
        self.swaps.finish()  # scatter the swapped-out blocks into the host pool
        forward_done = time.perf_counter()
        sample_errors: dict[int, str] = {}
        if any(samples):
            rows = [i for i, s in enumerate(samples) if s]  # logits row -> index in seqs
            sample = self.sampler.sample(logits, [seqs[i] for i in rows])
            for i, token in zip(rows, sample.token_ids, strict=True):
                sampled[i] = token
            sample_errors = {rows[row]: error for row, error in sample.errors.items()}
        ended = time.perf_counter()
        return StepResult(
            sampled,
            ended - started,
            self.swaps.swap_out_s,
            self.swaps.swap_in_s,
            forward_s,
            ended - forward_done,
            sample_errors,
        )


# -- construction ------------------------------------------------------------------------
