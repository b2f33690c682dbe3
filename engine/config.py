"""Engine configuration: one frozen dataclass per component, vLLM knob names.

Every field carries ``metadata={"help": ...}``; the CLI (``schedscope serve``,
``schedscope simulate``) generates its flags from that metadata, so a knob is
documented exactly once, here. Validation happens in ``__post_init__`` and raises
:class:`ConfigError` with a message that names the field and the bad value.
Derived values are properties; nothing is written back into a config at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

PREEMPTION_MODES: tuple[str, ...] = ("auto", "swap", "recompute")
#: The knob's allowed values, in the order the docs list them: the one list of policy
#: names (the CLI's choices, run files, the report). The scheduler's registry
#: (engine/core/sched/policy.py) holds a class for each and refuses any other.
SCHEDULING_POLICIES: tuple[str, ...] = ("fcfs", "sjf", "priority", "lpm")
BATCHING_MODES: tuple[str, ...] = ("continuous", "static")
SIZE_ESTIMATORS: tuple[str, ...] = ("request", "oracle")

GiB = 1 << 30

#: vLLM's default token budget when chunked prefill is on.
DEFAULT_CHUNKED_TOKEN_BUDGET = 2048


class ConfigError(ValueError):
    """A knob has a value the engine cannot run with; the message names it."""


def _help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler may put into one step and in which order."""

    max_num_seqs: int = field(
        default=256, metadata=_help("Maximum number of sequences running in one step.")
    )
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata=_help(
            "Maximum number of tokens computed in one step (the token budget). "
            "Default: 2048 with chunked prefill, else max(max_model_len, 2048)."
        ),
    )
    max_model_len: int = field(
        default=2048,
        metadata=_help("Maximum prompt + output length of one request; longer ones are rejected."),
    )
    scheduling_policy: str = field(
        default="fcfs",
        metadata=_help(
            "Order of service: fcfs, sjf (shortest estimated job), priority, or lpm "
            "(longest prefix match: the waiting request with the most prompt tokens in the "
            "prefix cache first, among the oldest 128 waiting; fcfs with prefix caching off).",
            choices=SCHEDULING_POLICIES,
        ),
    )
    preemption_mode: str = field(
        default="auto",
        metadata=_help(
            "How a request is preempted when KV blocks run out: swap (to the host pool; "
            "falls back to recompute for a request when the host pool is full; vLLM V0 "
            "only: vLLM V1 has no swap), recompute (drop its KV, re-prefill later, re-hitting "
            "what the prefix cache kept: vLLM V1's only mode) or auto (schedscope's own: per "
            "request, whichever the cost model predicts is cheaper, swapping only while the "
            "host pool has room).",
            choices=PREEMPTION_MODES,
        ),
    )
    aging_rate: float = field(
        default=0.0,
        metadata=_help(
            "sjf/priority/lpm aging: a waiting request's key improves by this much per second "
            "waited (sjf: tokens of size per second; priority: priority levels per second; "
            "lpm: cached tokens per second)."
        ),
    )
    max_wait_s: float | None = field(
        default=None,
        metadata=_help(
            "Hard bound on queueing: a request waiting longer than this is served next, "
            "preempting running requests if it must."
        ),
    )
    enable_chunked_prefill: bool = field(
        default=True,
        metadata=_help("Split long prefills into chunks that fit the token budget."),
    )
    batching: str = field(
        default="continuous",
        metadata=_help(
            "continuous: requests join and leave every step; static: collect a batch, run "
            "it to completion, no joins.",
            choices=BATCHING_MODES,
        ),
    )
    static_batch_timeout_s: float = field(
        default=0.05,
        metadata=_help("Static batching: start a partial batch after waiting this long."),
    )
    max_waiting: int | None = field(
        default=None,
        metadata=_help("Admission bound: new requests are refused while this many wait."),
    )
    max_num_queued_reqs: int | None = field(
        default=None,
        metadata=_help(
            "vLLM 0.32's admission cap: a new request is refused (503) when the unfinished "
            "ones (waiting, running, preempted) plus it would exceed this; unset: no cap."
        ),
    )
    max_num_queued_tokens: int | None = field(
        default=None,
        metadata=_help(
            "vLLM 0.32's prefill backlog cap: a new request is refused (503) while the "
            "prompt tokens of the requests with no token out yet reach this; unset: no cap."
        ),
    )
    long_prefill_token_threshold: int = field(
        default=0,
        metadata=_help(
            "vLLM 0.32's long-prefill cap (chunked prefill): no request computes more than "
            "this many tokens in one step while another request runs or waits, so a long "
            "prompt cannot take the token budget from the rest; 0: no cap."
        ),
    )
    long_prefill_token_threshold_adaptive: bool = field(
        default=False,
        metadata=_help(
            "vLLM 0.32's floor on that cap: a fair share of the token budget, "
            "max_num_batched_tokens over the requests running and waiting."
        ),
    )
    sjf_size_estimator: str = field(
        default="request",
        metadata=_help(
            "How sjf sizes a job: request (prompt tokens + max_tokens, what a server knows) "
            "or oracle (prompt + true output length; simulation studies only).",
            choices=SIZE_ESTIMATORS,
        ),
    )

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _require(self.max_model_len >= 1, f"max_model_len must be >= 1, got {self.max_model_len}")
        _require(
            self.scheduling_policy in SCHEDULING_POLICIES,
            f"scheduling_policy must be one of {SCHEDULING_POLICIES}, "
            f"got {self.scheduling_policy!r}",
        )
        _require(
            self.preemption_mode in PREEMPTION_MODES,
            f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}",
        )
        _require(
            self.batching in BATCHING_MODES,
            f"batching must be one of {BATCHING_MODES}, got {self.batching!r}",
        )
        _require(
            self.sjf_size_estimator in SIZE_ESTIMATORS,
            f"sjf_size_estimator must be one of {SIZE_ESTIMATORS}, got {self.sjf_size_estimator!r}",
        )
        _require(self.aging_rate >= 0, f"aging_rate must be >= 0, got {self.aging_rate}")
        _require(
            self.max_wait_s is None or self.max_wait_s > 0,
            f"max_wait_s must be > 0 (or unset), got {self.max_wait_s}",
        )
        _require(
            self.static_batch_timeout_s >= 0,
            f"static_batch_timeout_s must be >= 0, got {self.static_batch_timeout_s}",
        )
        _require(
            self.max_waiting is None or self.max_waiting >= 1,
            f"max_waiting must be >= 1 (or unset), got {self.max_waiting}",
        )
        threshold = self.long_prefill_token_threshold
        _require(
            0 <= threshold <= self.max_model_len,
            f"long_prefill_token_threshold must be from 0 to max_model_len "
            f"({self.max_model_len}), got {threshold}",
        )
        _require(
            not threshold or self.enable_chunked_prefill,
            "long_prefill_token_threshold caps a prefill's chunk: it needs enable_chunked_prefill",
        )
        for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
            value = getattr(self, name)
            _require(value is None or value >= 0, f"{name} must be >= 0 (or unset), got {value}")
        if self.max_num_batched_tokens is not None:
            _require(
                self.max_num_batched_tokens >= 1,
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
            )
            if not self.enable_chunked_prefill:
                # Without chunking a prefill must fit one step whole, and a recomputed
                # request re-prefills up to max_model_len tokens.
                _require(
                    self.max_num_batched_tokens >= self.max_model_len,
                    "max_num_batched_tokens "
                    f"({self.max_num_batched_tokens}) must be >= max_model_len "
                    f"({self.max_model_len}) when enable_chunked_prefill is off, or the "
                    "longest prompts could never be scheduled",
                )

    @property
    def token_budget(self) -> int:
        """The effective ``max_num_batched_tokens``."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.enable_chunked_prefill:
            return DEFAULT_CHUNKED_TOKEN_BUDGET
        return max(self.max_model_len, DEFAULT_CHUNKED_TOKEN_BUDGET)


@dataclass(frozen=True)
class CacheConfig:
    """How large the device and host KV pools are and how they are carved into blocks."""

    block_size: int = field(default=16, metadata=_help("Tokens per KV cache block."))
    gpu_memory_utilization: float = field(
        default=0.9,
        metadata=_help(
            "Fraction of device memory the engine may use (weights + activations + KV cache)."
        ),
    )
    swap_space: float = field(
        default=4.0,
        metadata=_help(
            "Host (CPU) memory for swapped-out KV blocks, in GiB (swap is vLLM V0's: vLLM "
            "V1 removed it and --swap-space)."
        ),
    )
    num_gpu_blocks_override: int | None = field(
        default=None,
        metadata=_help("Fix the number of device KV blocks instead of sizing from memory."),
    )
    num_cpu_blocks_override: int | None = field(
        default=None,
        metadata=_help("Fix the number of host KV blocks instead of sizing from swap_space."),
    )
    device_memory: float | None = field(
        default=None,
        metadata=_help(
            "Device memory in GiB the engine may assume. Default: the GPU's free memory on "
            "CUDA; 1 GiB on the CPU and in simulation, standing in for device memory so "
            "--gpu-memory-utilization keeps its meaning."
        ),
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata=_help(
            "Automatic prefix caching, on by default as in vLLM V1: full KV blocks are "
            "kept (keyed by their tokens and everything before them) after their request "
            "frees them, and a request whose prompt starts with cached blocks takes them "
            "instead of computing them; least recently freed blocks are evicted first."
        ),
    )
    watermark: float = field(
        default=0.01,
        metadata=_help(
            "Fraction of device blocks kept free when admitting new prefills, so running "
            "requests can grow without immediate preemption."
        ),
    )

    def __post_init__(self) -> None:
        _require(
            self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
            f"block_size must be a positive power of two, got {self.block_size}",
        )
        _require(
            0 < self.gpu_memory_utilization <= 1,
            f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _require(self.swap_space >= 0, f"swap_space must be >= 0 GiB, got {self.swap_space}")
        _require(
            self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 1,
            f"num_gpu_blocks_override must be >= 1, got {self.num_gpu_blocks_override}",
        )
        _require(
            self.num_cpu_blocks_override is None or self.num_cpu_blocks_override >= 0,
            f"num_cpu_blocks_override must be >= 0, got {self.num_cpu_blocks_override}",
        )
        _require(
            self.device_memory is None or self.device_memory > 0,
            f"device_memory must be > 0 GiB, got {self.device_memory}",
        )
        _require(0 <= self.watermark < 1, f"watermark must be in [0, 1), got {self.watermark}")


@dataclass(frozen=True)
class ExecutionConfig:
    """How the model's steps are run on the device (the torch executor only)."""

    enforce_eager: bool = field(
        default=False,
        metadata=_help(
            "Run every step eagerly. Without it, decode-only steps on CUDA replay CUDA "
            "graphs captured per padded batch size and context length (as vLLM's "
            "--enforce-eager); the CPU always runs eagerly."
        ),
    )


@dataclass(frozen=True)
class EngineConfig:
    """Everything one engine instance runs with."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    model: str = field(
        default="tiny",
        metadata=_help(
            "Model preset (tiny, small; llama3-8b on CUDA only) or a local Hugging Face "
            "Llama checkpoint directory (config.json + *.safetensors; nothing is downloaded)."
        ),
    )
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)

    def __post_init__(self) -> None:
        if self.scheduler.enable_chunked_prefill and self.scheduler.max_num_batched_tokens:
            # Chunks are cut at block boundaries so a chunk never leaves a block half
            # written by one step and half by the next in a way the runner must track.
            _require(
                self.scheduler.max_num_batched_tokens % self.cache.block_size == 0,
                f"max_num_batched_tokens ({self.scheduler.max_num_batched_tokens}) must be a "
                f"multiple of block_size ({self.cache.block_size}) when chunked prefill is on",
            )


def knob_fields(config_cls: type) -> list[dataclasses.Field]:
    """The fields of a config class in declaration order (the CLI builds flags from them)."""
    return [f for f in dataclasses.fields(config_cls) if f.init]
