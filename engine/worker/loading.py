"""Loading the bundled model onto a device and sizing its KV pools: a preset with
seeded random weights or a local Hugging Face Llama checkpoint; the activation peak
reserved beside the weights (estimated on the CPU, measured on CUDA, as vLLM does);
a runner prepared for serving, or one for calibration.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig, GiB
from engine.core.kv_plan import KvPlan, plan_kv_blocks
from engine.worker.decode_graphs import MAX_GRAPH_CONTEXT, padded_batch_sizes
from engine.worker.decode_graphs import workspace_bytes as graph_workspace_bytes
from engine.worker.model import AttentionMetadata, LlamaForCausalLM, allocate_kv_cache, build_model
from engine.worker.model_config import ModelConfig
from engine.worker.model_runner import ModelRunner

log = logging.getLogger("schedscope.engine")


def resolve_model_config(name_or_dir: str) -> tuple[ModelConfig, Path | None]:
    """A preset name, or a directory holding a Hugging Face Llama checkpoint."""
    path = Path(name_or_dir)
    if path.is_dir():
        from engine.worker.weights import load_config

        return load_config(path), path
    return ModelConfig.preset(name_or_dir), None


def load_model(
    name_or_dir: str, device: torch.device
) -> tuple[LlamaForCausalLM, ModelConfig, Path | None]:
    """The bundled preset with seeded random weights, or a local checkpoint's weights."""
    model_config, model_dir = resolve_model_config(name_or_dir)
    if model_dir is None:
        return build_model(model_config, device), model_config, None
    from engine.worker.weights import load_checkpoint

    model, model_config = load_checkpoint(model_dir, device)
    return model, model_config, model_dir


def activation_bytes_estimate(model_config: ModelConfig, max_tokens: int, max_seqs: int) -> int:
    """Peak activation memory of one step, estimated: hidden-sized buffers and the MLP's
    intermediate per token, plus float32 logits for every sampled sequence. (On CUDA the
    peak is measured instead.)"""
    per_token = (
        6 * model_config.hidden_size + 3 * model_config.intermediate_size
    ) * model_config.dtype_size
    return max_tokens * per_token + max_seqs * model_config.vocab_size * 4


def decode_graph_mode(device: torch.device, enforce_eager: bool) -> str:
    """How a served runner runs decode steps: ``capture`` (CUDA graphs) on CUDA unless
    ``--enforce-eager``; ``off`` (eager) otherwise and always on the CPU."""
    return "capture" if device.type == "cuda" and not enforce_eager else "off"


@dataclass
class PreparedRunner:
    """A model runner on its device with KV pools sized from the memory knobs."""

    runner: ModelRunner
    kv_plan: KvPlan
    model_config: ModelConfig
    #: The checkpoint directory, or None for a preset with seeded random weights.
    model_dir: Path | None


def prepare_torch_runner(
    config: EngineConfig,
    device: str | torch.device | None = None,
    model: LlamaForCausalLM | None = None,
    warm_up: bool = True,
) -> PreparedRunner:
    """The bundled model, its KV pools sized from the memory knobs, on ``device``
    (default: CUDA when available). ``warm_up`` runs one step of the largest prefill
    and the largest decode before anything is measured (``ModelRunner.warm_up``)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    free_before_load = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    given = model is not None
    if model is not None:  # a model built by the caller brings its own shapes
        model_config, model_dir = model.config, None
    else:
        model, model_config, model_dir = load_model(config.model, device)
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if given and free_before_load is not None and model.device == device:
        free_before_load += weights_bytes  # its weights were already on the device
    sched = config.scheduler
    budget = sched.token_budget
    if device.type == "cuda":  # pragma: no cover - CUDA only
        # vLLM's meaning: the device's free memory (before our weights) x utilization,
        # minus the weights and a measured activation peak.
        activation = _profile_activation_peak(
            model, model_config, budget, sched.max_num_seqs, device
        )
        device_memory = (
            int(config.cache.device_memory * GiB)
            if config.cache.device_memory
            else free_before_load
        )
    else:
        activation = activation_bytes_estimate(model_config, budget, sched.max_num_seqs)
        device_memory = None  # plan_kv_blocks uses --device-memory or its CPU default
    graphs = decode_graph_mode(device, config.execution.enforce_eager)
    if graphs == "capture":  # the graphs' gather workspace lives beside the KV pool
        max_context = min(sched.max_model_len, MAX_GRAPH_CONTEXT)
        activation += graph_workspace_bytes(
            model_config,
            config.cache.block_size,
            padded_batch_sizes(sched.max_num_seqs)[-1],
            -(-max_context // config.cache.block_size),
        )
    plan: KvPlan = plan_kv_blocks(
        config.cache,
        model_config.kv_bytes_per_block(config.cache.block_size),
        weights_bytes,
        activation,
        device_memory,
    )
    message = f"{plan.describe(config.cache.block_size)} on {device}"
    log.info(message)
    print(message, file=sys.stderr, flush=True)  # stdout is for the serving line
    runner = ModelRunner(
        model,
        model_config,
        config.cache.block_size,
        plan.num_device_blocks,
        plan.num_host_blocks,
        device,
        decode_graphs=graphs,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=sched.max_model_len,
    )
    if warm_up:
        tokens = min(budget, sched.max_model_len)
        seconds = runner.warm_up(tokens, sched.max_num_seqs, sched.max_model_len)
        log.info(
            "warm-up: a %d-token prefill and a %d-sequence decode over %d tokens each in %.2f s",
            tokens,
            sched.max_num_seqs,
            sched.max_model_len,
            seconds,
        )
    return PreparedRunner(runner, plan, model_config, model_dir)


def _profile_activation_peak(
    model: LlamaForCausalLM,
    model_config: ModelConfig,
    num_tokens: int,
    num_seqs: int,
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
    model_name: str, block_size: int, shapes, device: str | torch.device | None = None
) -> tuple[ModelRunner, str]:
    """A runner with pools large enough for every shape in ``shapes`` (calibration)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    model, model_config, _ = load_model(model_name, device)
    num_blocks = max(
        max(s.num_blocks(block_size) for s in shapes), max(s.swap_blocks for s in shapes), 1
    )
    runner = ModelRunner(
        model, model_config, block_size, num_blocks, max(s.swap_blocks for s in shapes), device
    )
    return runner, model_config.name
