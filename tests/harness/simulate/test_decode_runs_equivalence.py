"""Decode runs (``engine.sim.decode_runs``, ``simulate(fast=True)``) against plain
stepping (``fast=False``) on random small schedules and knobs: every record the
simulator keeps must come out the same, bit for bit."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.profiles import profile_from_dict
from harness.records.decision_log import decisions_frame
from harness.simulate.driver import simulate


@st.composite
def cases(draw):
    """A profile (one or two classes, an open phase and sometimes a closed one), the
    engine's knobs and a cost model, all small."""
    classes = []
    for i in range(draw(st.integers(1, 2))):
        low = draw(st.integers(1, 200))
        out_low = draw(st.integers(1, 60))
        classes.append(
            {
                "name": f"c{i}",
                "weight": draw(st.integers(1, 3)),
                "priority": draw(st.integers(0, 2)),
                "max_tokens": draw(st.integers(1, 120)),
                "prompt_tokens": {
                    "kind": "uniform",
                    "low": low,
                    "high": low + draw(st.integers(0, 300)),
                },
                "output_tokens": {
                    "kind": "uniform",
                    "low": out_low,
                    "high": out_low + draw(st.integers(0, 80)),
                },
            }
        )
    phases = [{"name": "open", "duration_s": draw(st.floats(1, 6)), "rate": draw(st.floats(1, 40))}]
    if draw(st.booleans()):
        phases.append(
            {
                "name": "closed",
                "duration_s": draw(st.floats(0.5, 3)),
                "concurrency": draw(st.integers(1, 6)),
            }
        )
    profile = profile_from_dict(
        {"name": "random", "seed": draw(st.integers(0, 1000)), "classes": classes, "phases": phases}
    )
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    chunked = draw(st.booleans())
    max_model_len = draw(st.sampled_from([2048, 300]))
    budget = draw(st.sampled_from([None, 16, 64, 704]))
    if not chunked and budget is not None:
        budget = max(budget, max_model_len)  # whole prefills need a whole prompt's budget
    scheduler = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 24)),
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        scheduling_policy=draw(st.sampled_from(["fcfs", "sjf", "priority", "lpm"])),
        preemption_mode=draw(st.sampled_from(["auto", "swap", "recompute"])),
        aging_rate=draw(st.sampled_from([0.0, 50.0])),
        max_wait_s=draw(st.sampled_from([None, 0.5])),
        enable_chunked_prefill=chunked,
        batching=draw(st.sampled_from(["continuous", "continuous", "static"])),
        max_waiting=draw(st.sampled_from([None, 5])),
        # vLLM's long-prefill cap (chunked prefill only), now and then adaptive
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 24, 100])) if chunked else 0,
        long_prefill_token_threshold_adaptive=draw(st.booleans()),
    )
    cache = CacheConfig(
        block_size=block_size,
        num_gpu_blocks_override=draw(st.integers(8, 400)) * 16 // block_size,
        num_cpu_blocks_override=draw(st.sampled_from([0, 4, 64])) * 16 // block_size,
    )
    cost = CostModel(
        step_overhead_s=draw(st.sampled_from([0.0, 0.003, 0.3])),
        decode_seq_s=draw(st.sampled_from([0.0, 1e-4, 0.0123])),
        decode_context_token_s=draw(st.sampled_from([0.0, 1e-7, 3.3e-6])),
        prefill_token_s=draw(st.sampled_from([0.0, 2e-5])),
        decode_small_batch_seq_s=draw(st.sampled_from([0.0, 9e-5, 0.0071])),
    )
    return profile, EngineConfig(scheduler, cache), cost


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_decode_runs_give_the_records_plain_stepping_gives(case):
    profile, config, cost = case
    fast = simulate(profile, config, cost, fast=True)
    plain = simulate(profile, config, cost, fast=False)
    assert fast.num_steps == plain.num_steps
    assert fast.duration_s == plain.duration_s
    assert fast.stall_threshold_s == plain.stall_threshold_s
    assert fast.requests.equals(plain.requests, null_equal=True)
    assert fast.steps is not None and plain.steps is not None
    assert fast.steps.equals(plain.steps, null_equal=True)
    assert decisions_frame(fast.decisions).equals(decisions_frame(plain.decisions), null_equal=True)
    assert fast.step_stats == plain.step_stats
