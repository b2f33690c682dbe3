"""The torch executor: a SchedulerOutput in, sampled tokens and the step's time out.

Per step: copy the blocks the scheduler swapped out (device -> host) and in (host ->
device), in that order — a block freed by a swap-out may be refilled by a swap-in or a
new prefill in the same step — then build the flat input of every scheduled
sequence's new tokens (prefill chunks and decodes in one forward), run the model over
the paged KV cache, and sample one token for each sequence that completed its
scheduled tokens. A row that cannot be sampled fails its own request only
(``StepResult.sample_errors``); an exception here fails the whole step.

The runner's process keeps freed host memory (engine/host_memory.py): without that,
every prefill step page-faulted its activations in afresh.

Device-agnostic: CUDA when present (pinned host pool, non-blocking copies, a
synchronisation before the step's time is read), CPU otherwise. Only the CPU path
runs in this project's tests; see docs/execution.md for what has run where.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from engine.clock import VirtualClock, WallClock
from engine.config import EngineConfig, GiB
from engine.cost_model import CostModel
from engine.executor import StepResult
from engine.host_memory import retain_freed_host_memory
from engine.llm_engine import LLMEngine
from engine.memory import KvPlan, plan_kv_blocks
from engine.model import AttentionMetadata, LlamaForCausalLM, allocate_kv_cache, build_model
from engine.model_config import ModelConfig
from engine.sampler import Sampler
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence

log = logging.getLogger("schedscope.engine")


def _new_token_ids(seq: Sequence, start: int, end: int) -> list[int]:
    """Token ids [start, end) of ``seq`` without concatenating prompt and output."""
    num_prompt = seq.num_prompt_tokens
    if start >= num_prompt:
        return seq.output_token_ids[start - num_prompt:end - num_prompt]
    if end <= num_prompt:
        return seq.prompt_token_ids[start:end]
    return seq.prompt_token_ids[start:] + seq.output_token_ids[:end - num_prompt]


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
    ) -> None:
        self.model = model
        self.model_config = model_config
        self.block_size = block_size
        self.device = device
        self.is_cuda = device.type == "cuda"
        # Before the pools are allocated: a step's activations must not be page-faulted
        # in afresh every step (engine/host_memory.py has the measurements).
        self.retains_host_memory = retain_freed_host_memory()
        self.device_cache = allocate_kv_cache(model_config, num_device_blocks, block_size, device)
        # Pinned host memory lets device<->host copies run asynchronously on CUDA.
        self.host_cache = allocate_kv_cache(
            model_config, max(num_host_blocks, 0), block_size, "cpu", pin_memory=self.is_cuda
        )
        self.sampler = Sampler(model_config.eos_token_id)
        self.last_swap_s = 0.0  # time of the last step's block copies (for calibration)

    # -- swap ------------------------------------------------------------------------
    def copy_blocks(self, mapping: list[tuple[int, int]], to_host: bool) -> None:
        """Copy KV blocks between pools for every layer: (source, destination) ids."""
        if not mapping:
            return
        src = torch.tensor([s for s, _ in mapping], dtype=torch.long)
        dst = torch.tensor([d for _, d in mapping], dtype=torch.long)
        source_cache, target_cache = (
            (self.device_cache, self.host_cache) if to_host else (self.host_cache, self.device_cache)
        )
        src = src.to(source_cache[0][0].device)
        dst = dst.to(target_cache[0][0].device)
        # Host -> device may be asynchronous (the device-side index_copy_ is ordered after
        # it on the stream); device -> host must not be: the CPU-side index_copy_ reads
        # the copied blocks at once.
        non_blocking = self.is_cuda and not to_host
        for (src_k, src_v), (dst_k, dst_v) in zip(source_cache, target_cache, strict=True):
            for source, target in ((src_k, dst_k), (src_v, dst_v)):
                blocks = source.index_select(0, src).to(target.device, non_blocking=non_blocking)
                target.index_copy_(0, dst, blocks)

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
        block table (reads only; their one new slot each is the same scratch slot)."""
        capacity = self.device_cache[0][0].shape[0] * self.block_size
        started = time.perf_counter()
        shapes = []
        if min(num_tokens, capacity) >= 1:
            n = min(num_tokens, capacity)
            shapes.append(([n], [n]))
        if num_seqs >= 1 and min(context_len, capacity) >= 1:
            n = min(context_len, capacity)
            shapes.append(([1] * num_seqs, [n] * num_seqs))
        for query_lens, seq_lens in shapes:
            blocks = list(range(-(-max(seq_lens) // self.block_size)))
            metadata, positions = AttentionMetadata.build(
                query_lens, seq_lens, [blocks] * len(seq_lens), self.block_size, self.device,
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
        swap_out_s = swap_in_s = 0.0
        if out.blocks_to_swap_out:
            self.copy_blocks(out.blocks_to_swap_out, to_host=True)  # blocking: nothing to sync
            swap_out_s = time.perf_counter() - started
        if out.blocks_to_swap_in:
            self.copy_blocks(out.blocks_to_swap_in, to_host=False)
            self._synchronize()
            swap_in_s = time.perf_counter() - started - swap_out_s
        self.last_swap_s = swap_out_s + swap_in_s
        seqs = out.seqs
        if not seqs:
            return StepResult([], time.perf_counter() - started, swap_out_s, swap_in_s)

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
        # Logits only for sequences that sample (none for partial prefill chunks).
        metadata, positions = AttentionMetadata.build(
            query_lens, seq_lens, [seq.block_table for seq in seqs], self.block_size,
            self.device, samples,
        )
        tokens = torch.tensor(input_ids, dtype=torch.long).to(self.device, non_blocking=self.is_cuda)
        logits = self.model(tokens, positions, self.device_cache, metadata)
        self._synchronize()
        forward_done = time.perf_counter()
        sample_errors: dict[int, str] = {}
        if any(samples):
            rows = [i for i, s in enumerate(samples) if s]  # logits row -> index in seqs
            sample = self.sampler.sample(logits, [seqs[i] for i in rows])
            for i, token in zip(rows, sample.token_ids, strict=True):
                sampled[i] = token
            sample_errors = {rows[row]: error for row, error in sample.errors.items()}
        ended = time.perf_counter()
        forward_s = forward_done - started - swap_out_s - swap_in_s
        return StepResult(sampled, ended - started, swap_out_s, swap_in_s, forward_s,
                          ended - forward_done, sample_errors)


# -- construction ------------------------------------------------------------------------


def resolve_model_config(name_or_dir: str) -> tuple[ModelConfig, Path | None]:
    """A preset name, or a directory holding a Hugging Face Llama checkpoint."""
    path = Path(name_or_dir)
    if path.is_dir():
        from engine.weights import load_config

        return load_config(path), path
    return ModelConfig.preset(name_or_dir), None


def load_model(
    name_or_dir: str, device: torch.device
) -> tuple[LlamaForCausalLM, ModelConfig, Path | None]:
    """The bundled preset with seeded random weights, or a local checkpoint's weights."""
    model_config, model_dir = resolve_model_config(name_or_dir)
    if model_dir is None:
        return build_model(model_config, device), model_config, None
    from engine.weights import load_checkpoint

    model, model_config = load_checkpoint(model_dir, device)
    return model, model_config, model_dir


def activation_bytes_estimate(model_config: ModelConfig, max_tokens: int, max_seqs: int) -> int:
    """Peak activation memory of one step, estimated: hidden-sized buffers and the MLP's
    intermediate per token, plus float32 logits for every sampled sequence. (On CUDA the
    peak is measured instead.)"""
    per_token = (6 * model_config.hidden_size + 3 * model_config.intermediate_size) * model_config.dtype_size
    return max_tokens * per_token + max_seqs * model_config.vocab_size * 4


def build_torch_engine(
    config: EngineConfig,
    clock: WallClock | VirtualClock | None = None,
    device: str | torch.device | None = None,
    model: LlamaForCausalLM | None = None,
    cost_model: CostModel | None = None,
    warm_up: bool = True,
) -> LLMEngine:
    """The bundled model, its KV pools sized from the memory knobs, on ``device``
    (default: CUDA when available). ``cost_model`` prices swap against recompute for
    ``--preemption-mode auto`` (default: the built-in one). ``warm_up`` runs one step of
    the largest prefill before the engine starts (``ModelRunner.warm_up``)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    free_before_load = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    if model is not None:  # a model built by the caller brings its own shapes
        model_config, model_dir = model.config, None
    else:
        model, model_config, model_dir = load_model(config.model, device)
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sched = config.scheduler
    budget = sched.token_budget
    if device.type == "cuda":  # pragma: no cover - CUDA only
        # vLLM's meaning: the device's free memory (before our weights) x utilization,
        # minus the weights and a measured activation peak.
        activation = _profile_activation_peak(model, model_config, budget, sched.max_num_seqs, device)
        device_memory = (int(config.cache.device_memory * GiB) if config.cache.device_memory
                         else free_before_load)
    else:
        activation = activation_bytes_estimate(model_config, budget, sched.max_num_seqs)
        device_memory = None  # plan_kv_blocks uses --device-memory or its CPU default
    plan: KvPlan = plan_kv_blocks(
        config.cache, model_config.kv_bytes_per_block(config.cache.block_size), weights_bytes,
        activation, device_memory,
    )
    message = f"{plan.describe(config.cache.block_size)} on {device}"
    log.info(message)
    print(message, file=sys.stderr, flush=True)  # stdout is for the serving line
    runner = ModelRunner(model, model_config, config.cache.block_size, plan.num_device_blocks,
                         plan.num_host_blocks, device)
    if warm_up:
        tokens = min(budget, sched.max_model_len)
        seconds = runner.warm_up(tokens, sched.max_num_seqs, sched.max_model_len)
        log.info("warm-up: a %d-token prefill and a %d-sequence decode over %d tokens each "
                 "in %.2f s", tokens, sched.max_num_seqs, sched.max_model_len, seconds)
    engine = LLMEngine(config, runner, clock or WallClock(), plan, model_config.eos_token_id,
                       cost_model=cost_model)
    engine.model_config = model_config
    engine.model_dir = model_dir
    return engine


def _profile_activation_peak(
    model: LlamaForCausalLM, model_config: ModelConfig, num_tokens: int, num_seqs: int,
    device: torch.device,
) -> int:  # pragma: no cover - CUDA only
    """Run one forward of ``num_tokens`` prefill tokens on a scratch cache and return
    the peak memory it allocated beyond what was allocated before (vLLM's method)."""
    block_size = 16
    num_blocks = -(-num_tokens // block_size)
    cache = allocate_kv_cache(model_config, num_blocks, block_size, device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    metadata, positions = AttentionMetadata.build(
        [num_tokens], [num_tokens], [list(range(num_blocks))], block_size, device
    )
    tokens = torch.zeros(num_tokens, dtype=torch.long, device=device)
    model(tokens, positions, cache, metadata)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del cache
    torch.cuda.empty_cache()
    return int(peak) + num_seqs * model_config.vocab_size * 4


def calibration_runner(
    model_name: str, block_size: int, shapes, device: str | None = None
) -> tuple[ModelRunner, str]:
    """A runner with pools large enough for every shape in ``shapes`` (calibration)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    model, model_config, _ = load_model(model_name, device)
    num_blocks = max(max(s.num_blocks(block_size) for s in shapes),
                     max(s.swap_blocks for s in shapes), 1)
    runner = ModelRunner(model, model_config, block_size, num_blocks,
                         max(s.swap_blocks for s in shapes), device)
    return runner, model_config.name
