"""Which of the bundled engine's knobs vLLM's ``vllm serve`` takes as flags, under the
same name (``max_num_seqs`` -> ``--max-num-seqs``; harness/serve/knobs.py spells them).
The rest are schedscope's scheduler's own: aging, the max-wait bound, sjf, static
batching. ``tune`` prints the winner's ``vllm serve`` line from these and spells a
launched engine's flags from them (harness/tune/)."""

VLLM_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "scheduling_policy",
    "preemption_mode",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "gpu_memory_utilization",
    "swap_space",
    "num_gpu_blocks_override",
    "max_num_queued_reqs",
    "max_num_queued_tokens",
)
#: vLLM's --scheduling-policy values.
VLLM_POLICIES = ("fcfs", "priority")
#: vLLM's flags that vLLM V1 no longer takes (its preemption is recompute only, it has
#: no swap space).
NOT_IN_V1 = ("preemption_mode", "swap_space")
