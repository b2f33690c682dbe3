"""Sizing the KV pools from a memory budget, the way vLLM's knobs mean it.

Device blocks = (device memory x ``gpu_memory_utilization`` - weights - activation
peak) / bytes per block; host blocks = ``swap_space`` GiB / bytes per block. The
overrides fix either count directly (tests and studies).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import CacheConfig, ConfigError, GiB

#: What the CPU and the simulator assume as "device memory" when none is given.
DEFAULT_HOST_DEVICE_MEMORY_GIB = 1.0


@dataclass(frozen=True)
class KvPlan:
    num_device_blocks: int
    num_host_blocks: int
    bytes_per_block: int
    device_memory_bytes: int
    weights_bytes: int
    activation_bytes: int

    def describe(self, block_size: int) -> str:
        return (
            f"KV cache: {self.num_device_blocks} device blocks "
            f"({self.num_device_blocks * block_size} tokens, "
            f"{self.num_device_blocks * self.bytes_per_block / GiB:.3f} GiB), "
            f"{self.num_host_blocks} host blocks for swap "
            f"({self.num_host_blocks * self.bytes_per_block / GiB:.3f} GiB); "
            f"{self.bytes_per_block} bytes per block"
        )


def plan_kv_blocks(
    cache: CacheConfig,
    bytes_per_block: int,
    weights_bytes: int,
    activation_bytes: int = 0,
    device_memory_bytes: int | None = None,
) -> KvPlan:
    """Block counts for both pools. Raises ConfigError if no block fits."""
    if device_memory_bytes is None:
        gib = (
            cache.device_memory
            if cache.device_memory is not None
            else DEFAULT_HOST_DEVICE_MEMORY_GIB
        )
        device_memory_bytes = int(gib * GiB)
    if cache.num_gpu_blocks_override is not None:
        num_device = cache.num_gpu_blocks_override
    else:
        usable = (
            device_memory_bytes * cache.gpu_memory_utilization - weights_bytes - activation_bytes
        )
        num_device = int(usable // bytes_per_block)
        if num_device < 1:
            raise ConfigError(
                f"gpu_memory_utilization={cache.gpu_memory_utilization} of "
                f"{device_memory_bytes / GiB:.2f} GiB leaves no room for the KV cache after "
                f"{weights_bytes / GiB:.3f} GiB of weights and {activation_bytes / GiB:.3f} GiB "
                "of activations; raise it, or --device-memory, or set --num-gpu-blocks-override"
            )
    if cache.num_cpu_blocks_override is not None:
        num_host = cache.num_cpu_blocks_override
    else:
        num_host = int(cache.swap_space * GiB // bytes_per_block)
    return KvPlan(
        num_device, num_host, bytes_per_block, device_memory_bytes, weights_bytes, activation_bytes
    )
