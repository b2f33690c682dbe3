"""Policies (static keys, aging equivalence) and config validation messages."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import (
    DEFAULT_CHUNKED_TOKEN_BUDGET,
    CacheConfig,
    ConfigError,
    EngineConfig,
    ExecutionConfig,
    SchedulerConfig,
    knob_fields,
)
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sched.policy import FcfsPolicy, PriorityPolicy, SjfPolicy, make_policy
from engine.core.sequence import Sequence


def seq(
    arrival: float = 0.0,
    prompt: int = 4,
    max_tokens: int = 16,
    priority: int = 0,
    oracle: int | None = None,
    seq_no: int = 0,
) -> Sequence:
    return Sequence(
        EngineRequest(
            f"r{seq_no}",
            list(range(prompt)),
            SamplingParams(max_tokens=max_tokens),
            arrival,
            priority,
            oracle_output_tokens=oracle,
        ),
        seq_no,
    )


# -- keys --------------------------------------------------------------------------------


def test_fcfs_key_is_arrival_time_and_ignores_aging() -> None:
    s = seq(arrival=2.5, prompt=100, priority=7)
    assert FcfsPolicy().key(s) == 2.5
    assert FcfsPolicy(aging_rate=10.0).key(s) == 2.5
    assert not FcfsPolicy.preempts_for_waiting


def test_sjf_keys_by_estimator() -> None:
    s = seq(arrival=1.0, prompt=10, max_tokens=50, oracle=5)
    assert SjfPolicy(estimator="request").key(s) == 60.0  # prompt + max_tokens
    assert SjfPolicy(estimator="oracle").key(s) == 15.0  # prompt + true output
    no_oracle = seq(prompt=10, max_tokens=50, oracle=None)
    assert SjfPolicy(estimator="oracle").key(no_oracle) == 60.0  # falls back to the request
    # aging: base + rate * arrival
    assert SjfPolicy(aging_rate=3.0, estimator="request").key(s) == 63.0
    assert not SjfPolicy.preempts_for_waiting


def test_priority_key_is_priority_plus_aging() -> None:
    s = seq(arrival=2.0, priority=3)
    assert PriorityPolicy().key(s) == 3.0
    assert PriorityPolicy(aging_rate=0.5).key(s) == 4.0
    assert PriorityPolicy.preempts_for_waiting


def test_make_policy_follows_the_config() -> None:
    p = make_policy(
        SchedulerConfig(scheduling_policy="sjf", aging_rate=2.0, sjf_size_estimator="oracle")
    )
    assert isinstance(p, SjfPolicy) and p.aging_rate == 2.0 and p.estimator == "oracle"
    p = make_policy(SchedulerConfig(scheduling_policy="priority", aging_rate=0.25))
    assert isinstance(p, PriorityPolicy) and p.aging_rate == 0.25
    assert isinstance(make_policy(SchedulerConfig()), FcfsPolicy)


# Times in 1/8 s, rates in 1/4 per s, keys small integers: every product and sum
# below is exact in floating point, so ties are real ties on both sides.
requests = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 64), st.integers(1, 64), st.integers(0, 5)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    requests,
    st.sampled_from(["sjf", "priority"]),
    st.integers(0, 40).map(lambda r: r / 4),
    st.integers(0, 80),
)
def test_linear_aging_static_key_order_equals_effective_key_order(
    raw, policy_name, rate, later_eighths
) -> None:
    """At any time ``now`` after the arrivals, ordering by the static key
    ``base + rate * arrival`` equals ordering by the aged key
    ``base - rate * (now - arrival)``, ties broken by arrival order."""
    seqs = [
        seq(arrival=t / 8, prompt=p, max_tokens=m, priority=prio, seq_no=i)
        for i, (t, p, m, prio) in enumerate(sorted(raw, key=lambda r: r[0]))
    ]
    policy = make_policy(SchedulerConfig(scheduling_policy=policy_name, aging_rate=rate))
    now = max(s.arrival_time for s in seqs) + later_eighths / 8
    by_static = sorted(seqs, key=lambda s: (policy.key(s), s.seq_no))
    by_effective = sorted(
        seqs,
        key=lambda s: (policy.base_key(s) - rate * (now - s.arrival_time), s.seq_no),
    )
    assert [s.seq_no for s in by_static] == [s.seq_no for s in by_effective]


# -- config validation ------------------------------------------------------------------


def test_budget_not_a_multiple_of_block_size_with_chunking_names_both_knobs() -> None:
    with pytest.raises(ConfigError) as err:
        EngineConfig(SchedulerConfig(max_num_batched_tokens=20), CacheConfig(block_size=16))
    message = str(err.value)
    assert "max_num_batched_tokens (20)" in message and "block_size (16)" in message
    assert "chunked prefill" in message
    # without chunking a budget need not be a multiple of the block size
    EngineConfig(
        SchedulerConfig(max_num_batched_tokens=2050, enable_chunked_prefill=False),
        CacheConfig(block_size=16),
    )
    EngineConfig(SchedulerConfig(max_num_batched_tokens=32), CacheConfig(block_size=16))


def test_budget_below_max_model_len_without_chunking_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        SchedulerConfig(
            enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=1024
        )
    message = str(err.value)
    assert "max_num_batched_tokens (512)" in message and "max_model_len (1024)" in message
    assert "enable_chunked_prefill" in message
    SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=1024, max_model_len=1024)


@pytest.mark.parametrize(
    ("factory", "field", "value"),
    [
        (lambda: SchedulerConfig(max_num_seqs=0), "max_num_seqs", "0"),
        (lambda: SchedulerConfig(max_model_len=0), "max_model_len", "0"),
        (lambda: SchedulerConfig(max_num_batched_tokens=0), "max_num_batched_tokens", "0"),
        (lambda: SchedulerConfig(scheduling_policy="lifo"), "scheduling_policy", "'lifo'"),
        (lambda: SchedulerConfig(preemption_mode="kill"), "preemption_mode", "'kill'"),
        (lambda: SchedulerConfig(batching="dynamic"), "batching", "'dynamic'"),
        (lambda: SchedulerConfig(sjf_size_estimator="guess"), "sjf_size_estimator", "'guess'"),
        (lambda: SchedulerConfig(aging_rate=-1.0), "aging_rate", "-1.0"),
        (lambda: SchedulerConfig(max_wait_s=0.0), "max_wait_s", "0.0"),
        (lambda: SchedulerConfig(static_batch_timeout_s=-0.5), "static_batch_timeout_s", "-0.5"),
        (lambda: SchedulerConfig(max_waiting=0), "max_waiting", "0"),
        (lambda: CacheConfig(block_size=12), "block_size", "12"),
        (lambda: CacheConfig(block_size=0), "block_size", "0"),
        (lambda: CacheConfig(gpu_memory_utilization=0.0), "gpu_memory_utilization", "0.0"),
        (lambda: CacheConfig(gpu_memory_utilization=1.5), "gpu_memory_utilization", "1.5"),
        (lambda: CacheConfig(swap_space=-1.0), "swap_space", "-1.0"),
        (lambda: CacheConfig(num_gpu_blocks_override=0), "num_gpu_blocks_override", "0"),
        (lambda: CacheConfig(num_cpu_blocks_override=-1), "num_cpu_blocks_override", "-1"),
        (lambda: CacheConfig(device_memory=0.0), "device_memory", "0.0"),
        (lambda: CacheConfig(watermark=1.0), "watermark", "1.0"),
    ],
)
def test_bad_knobs_raise_config_error_naming_field_and_value(factory, field, value) -> None:
    with pytest.raises(ConfigError) as err:
        factory()
    assert isinstance(err.value, ValueError)
    assert field in str(err.value) and value in str(err.value)


def test_edge_values_are_accepted() -> None:
    CacheConfig(num_cpu_blocks_override=0, watermark=0.0, swap_space=0.0, block_size=1)
    SchedulerConfig(max_num_seqs=1, max_model_len=1, static_batch_timeout_s=0.0, aging_rate=0.0)


def test_token_budget_defaults() -> None:
    assert SchedulerConfig().token_budget == DEFAULT_CHUNKED_TOKEN_BUDGET
    assert SchedulerConfig(max_model_len=8192).token_budget == DEFAULT_CHUNKED_TOKEN_BUDGET
    off = SchedulerConfig(enable_chunked_prefill=False, max_model_len=8192)
    assert off.token_budget == 8192
    assert SchedulerConfig(enable_chunked_prefill=False, max_model_len=512).token_budget == 2048
    assert SchedulerConfig(max_num_batched_tokens=64).token_budget == 64


def test_configs_are_frozen_and_every_knob_has_help() -> None:
    config = SchedulerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_num_seqs = 3  # type: ignore[misc]
    # A section is a field whose default is a config class; each section's own knobs need help.
    sections = {
        f.name: f.default_factory
        for f in knob_fields(EngineConfig)
        if dataclasses.is_dataclass(f.default_factory)
    }
    assert set(sections.values()) == {SchedulerConfig, CacheConfig, ExecutionConfig}
    for cls in (*sections.values(), EngineConfig):
        for f in knob_fields(cls):
            if cls is EngineConfig and f.name in sections:
                continue
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_the_policy_names_have_one_home_and_each_a_registered_class() -> None:
    from engine.config import SCHEDULING_POLICIES
    from engine.core.sched.policy import POLICIES, POLICY_NAMES, Policy, register

    assert POLICY_NAMES is SCHEDULING_POLICIES
    assert set(POLICIES) == set(SCHEDULING_POLICIES)

    class Lifo(Policy):
        name = "lifo"

    # a class for a name the knob does not have is refused, naming where to add it
    with pytest.raises(ValueError, match="SCHEDULING_POLICIES"):
        register(Lifo)
    assert "lifo" not in POLICIES
