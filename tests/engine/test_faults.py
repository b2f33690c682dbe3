"""Planted faults (engine/faults.py): what SCHEDSCOPE_FAULT parses to, and that a
simulated engine built with them is slower by exactly the planted amount, or orders
sjf the wrong way round, and otherwise exactly as it was."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from engine.core.sched.policy import ReversedPolicy, SjfPolicy
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.delaying_executor import DelayingExecutor
from engine.executor import StepResult
from engine.factory import build_simulated_engine
from engine.faults import ENV_VAR, FaultError, Faults
from engine.sim.simulated_executor import SimulatedExecutor
from harness.profiles import resolve_profile
from harness.simulate.driver import simulate
from tests.support.engine_helpers import Req, drive

#: Powers of two, so every step duration and clock reading is an exact float sum:
#: "exactly the planted amount" can be compared with ==.
STEP_S = 1 / 64
DECODE_DELAY_S = 1 / 128
PREFILL_TOKEN_DELAY_S = 1 / 1024


# -- parsing ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Faults()),
        ("  ", Faults()),
        ("decode_step_delay_s=0.05", Faults(decode_step_delay_s=0.05)),
        ("prefill_token_delay_s=2e-4", Faults(prefill_token_delay_s=2e-4)),
        ("sjf_order=reversed", Faults(sjf_order="reversed")),
        (
            " prefill_token_delay_s = 0.001 , decode_step_delay_s=0.5,sjf_order=reversed, ",
            Faults(prefill_token_delay_s=0.001, decode_step_delay_s=0.5, sjf_order="reversed"),
        ),
        ("decode_step_delay_s=0", Faults()),  # a zero delay plants nothing
    ],
)
def test_valid_fault_specs_parse(text, expected):
    assert Faults.parse(text) == expected
    assert Faults.parse(text).active == (expected != Faults())


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("decode_delay_s=0.1", "decode_delay_s"),
        ("decode_step_delay_s=0.1,bogus=1", "bogus"),
        ("decode_step_delay_s=fast", "decode_step_delay_s"),
        ("decode_step_delay_s=", "decode_step_delay_s"),
        ("prefill_token_delay_s=-0.001", "prefill_token_delay_s"),
        ("prefill_token_delay_s=nan", "prefill_token_delay_s"),
        ("prefill_token_delay_s=inf", "prefill_token_delay_s"),
        ("sjf_order=forward", "sjf_order"),
        ("sjf_order=", "sjf_order"),
        ("decode_step_delay_s=0.1,decode_step_delay_s=0.2", "decode_step_delay_s"),
        ("decode_step_delay_s", "decode_step_delay_s"),  # not key=value
    ],
)
def test_each_bad_spec_is_an_error_naming_its_key(text, key):
    with pytest.raises(FaultError) as caught:
        Faults.parse(text)
    error = caught.value
    assert error.key == key
    assert repr(key) in str(error) and ENV_VAR in str(error)
    # a configuration error like any other: the server exits 2, simulate raises
    assert isinstance(error, ConfigError) and isinstance(error, ValueError)


def test_unset_or_empty_environment_plants_nothing():
    assert Faults.from_env({}) == Faults()
    assert Faults.from_env({ENV_VAR: ""}) == Faults()
    assert not Faults.from_env({ENV_VAR: ""}).active
    assert Faults.from_env({ENV_VAR: "sjf_order=reversed"}).reverses("sjf")


@given(
    prefill=st.floats(min_value=0, max_value=10, allow_nan=False),
    decode=st.floats(min_value=0, max_value=10, allow_nan=False),
    reversed_sjf=st.booleans(),
)
def test_describe_is_a_spec_that_parses_back_to_the_same_faults(prefill, decode, reversed_sjf):
    faults = Faults(prefill, decode, "reversed" if reversed_sjf else "")
    assert Faults.parse(faults.describe()) == faults
    assert set(faults.to_dict()) == {
        key
        for key, planted in (
            ("prefill_token_delay_s", prefill > 0),
            ("decode_step_delay_s", decode > 0),
            ("sjf_order", reversed_sjf),
        )
        if planted
    }


def test_step_delay_counts_prefill_tokens_and_one_delay_per_step_with_a_decode():
    faults = Faults(prefill_token_delay_s=0.25, decode_step_delay_s=4.0)
    assert faults.step_delay_s(0, 0) == 0.0
    assert faults.step_delay_s(8, 0) == 2.0
    assert faults.step_delay_s(0, 3) == 4.0  # per step, not per decoding sequence
    assert faults.step_delay_s(8, 3) == 6.0


# -- the engine the factory builds ------------------------------------------------------
def _config(**scheduler) -> EngineConfig:
    return EngineConfig(
        SchedulerConfig(**scheduler),
        CacheConfig(block_size=4, num_gpu_blocks_override=256, num_cpu_blocks_override=64),
    )


def _engine(faults: Faults, **scheduler):
    return build_simulated_engine(_config(**scheduler), CostModel.constant(STEP_S), faults=faults)


#: Every request at t=0, so the schedule cannot depend on how long steps take: a
#: faulted run schedules exactly the steps an unfaulted one does. A small token budget
#: chunks the prefills and mixes them with decodes.
WORKLOAD = [
    Req(f"r{i}", prompt_len=prompt, max_tokens=out)
    for i, (prompt, out) in enumerate([(40, 6), (9, 12), (23, 3), (5, 9), (60, 2), (17, 7)])
]
BUDGET = {"max_num_batched_tokens": 32, "max_num_seqs": 4}


def _steps(faults: Faults):
    return drive(_engine(faults, **BUDGET), WORKLOAD).steps


def _composition(step):
    return (
        step.step,
        [(s.request_id, s.kind, s.num_scheduled_tokens) for s in step.scheduled],
        step.num_prefill_tokens,
        step.num_decode_seqs,
    )


def _assert_shifted_by(faults: Faults, planted) -> None:
    plain, faulted = _steps(Faults()), _steps(faults)
    assert [_composition(s) for s in faulted] == [_composition(s) for s in plain]
    delays = [planted(s) for s in plain]
    # steps of several compositions, so a wrong formula shows
    assert sum(1 for d in delays if d > 0) >= 3 and len(set(delays)) >= 2, delays
    for before, after, delay in zip(plain, faulted, delays, strict=True):
        assert (
            after.execute_end - after.execute_start
            == (before.execute_end - before.execute_start) + delay
        ), after.step


def test_decode_step_delay_lengthens_every_step_with_a_decode_by_exactly_that_much():
    _assert_shifted_by(
        Faults(decode_step_delay_s=DECODE_DELAY_S),
        lambda step: DECODE_DELAY_S if step.num_decode_seqs else 0.0,
    )


def test_prefill_token_delay_lengthens_each_step_by_exactly_its_prefill_tokens():
    _assert_shifted_by(
        Faults(prefill_token_delay_s=PREFILL_TOKEN_DELAY_S),
        lambda step: PREFILL_TOKEN_DELAY_S * step.num_prefill_tokens,
    )


def test_both_delays_add_up():
    _assert_shifted_by(
        Faults(prefill_token_delay_s=PREFILL_TOKEN_DELAY_S, decode_step_delay_s=DECODE_DELAY_S),
        lambda step: (
            PREFILL_TOKEN_DELAY_S * step.num_prefill_tokens
            + (DECODE_DELAY_S if step.num_decode_seqs else 0.0)
        ),
    )


def test_recompute_tokens_count_as_prefill_tokens():
    """A recompute preemption's re-prefill is prefill work: it is delayed too."""
    pool = {"max_num_seqs": 8, "preemption_mode": "recompute"}
    tight = CacheConfig(block_size=4, num_gpu_blocks_override=12, num_cpu_blocks_override=0)
    reqs = [Req(f"r{i}", prompt_len=8, max_tokens=16) for i in range(4)]

    def run(faults: Faults):
        config = EngineConfig(SchedulerConfig(**pool), tight)
        engine = build_simulated_engine(config, CostModel.constant(STEP_S), faults=faults)
        return drive(engine, reqs).steps

    plain = run(Faults())
    faulted = run(Faults(prefill_token_delay_s=PREFILL_TOKEN_DELAY_S))
    assert any(s.num_recompute_tokens for s in plain), "the pool must force a recompute"
    for before, after in zip(plain, faulted, strict=True):
        assert after.duration_s - before.duration_s == pytest.approx(
            PREFILL_TOKEN_DELAY_S * before.num_prefill_tokens, abs=1e-12
        )


def test_without_faults_the_engine_is_as_it_was():
    engine = _engine(Faults(), scheduling_policy="sjf")
    assert type(engine.executor) is SimulatedExecutor
    assert type(engine.scheduler.policy) is SjfPolicy
    assert engine.faults == Faults() and not engine.faults.active


def test_the_factory_reads_the_environment_by_default(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "decode_step_delay_s=0.5")
    engine = build_simulated_engine(_config())
    assert engine.faults == Faults(decode_step_delay_s=0.5)
    assert isinstance(engine.executor, DelayingExecutor)
    monkeypatch.setenv(ENV_VAR, "decode_step_delay_s=0.5,colour=red")
    with pytest.raises(FaultError, match="'colour'"):
        build_simulated_engine(_config())


def test_a_bad_fault_stops_a_simulation_with_an_error_naming_the_key(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "prefill_token_delay_s=slow")
    with pytest.raises(ValueError, match="prefill_token_delay_s"):
        simulate(resolve_profile("default"), _config())


def test_an_active_fault_logs_one_warning_at_engine_start(caplog):
    with caplog.at_level(logging.WARNING, logger="schedscope.engine"):
        _engine(Faults())
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="schedscope.engine"):
        _engine(Faults(decode_step_delay_s=0.5, sjf_order="reversed"))
    [record] = caplog.records
    assert record.getMessage().startswith(
        "SCHEDSCOPE_FAULT active: decode_step_delay_s=0.5,sjf_order=reversed"
    )


def test_the_wall_clock_executor_sleeps_the_delay(monkeypatch):
    """Served (torch, or the sim executor on the wall clock) the delay passes for real:
    the wrapper sleeps it after the step and adds what it slept."""
    slept: list[float] = []
    monkeypatch.setattr("engine.delaying_executor.time.sleep", slept.append)

    class Inner:
        def execute(self, out):
            return StepResult([], 0.125)

    out = SchedulerOutput(step=1, time=0.0, num_prefill_tokens=10, num_decode_seqs=2)
    faults = Faults(prefill_token_delay_s=0.5, decode_step_delay_s=1.0)
    DelayingExecutor(Inner(), faults, sleep=True).execute(out)
    assert slept == [6.0]
    virtual = DelayingExecutor(Inner(), faults, sleep=False).execute(out)
    assert virtual.duration_s == 6.125 and slept == [6.0]  # no sleep on a virtual clock


# -- sjf_order=reversed -----------------------------------------------------------------
#: One request at a time, all waiting from t=0 (added in id order, which is neither the
#: size order nor its reverse): the admission order is the policy's.
ORDER_WORKLOAD = [
    Req("a-mid", prompt_len=20, max_tokens=4),
    Req("b-short", prompt_len=4, max_tokens=2),
    Req("c-long", prompt_len=60, max_tokens=8),
    Req("d-tiny", prompt_len=2, max_tokens=1),
]


def _admission_order(policy: str, faults: Faults) -> list[str]:
    engine = _engine(faults, scheduling_policy=policy, max_num_seqs=1)
    return drive(engine, ORDER_WORKLOAD).admission_order()


def test_reversed_sjf_admits_longest_first():
    assert _admission_order("sjf", Faults()) == ["d-tiny", "b-short", "a-mid", "c-long"]
    reversed_sjf = Faults(sjf_order="reversed")
    assert _admission_order("sjf", reversed_sjf) == ["c-long", "a-mid", "b-short", "d-tiny"]


def test_reversed_sjf_changes_nothing_under_fcfs():
    arrival_order = ["a-mid", "b-short", "c-long", "d-tiny"]
    assert _admission_order("fcfs", Faults()) == arrival_order
    assert _admission_order("fcfs", Faults(sjf_order="reversed")) == arrival_order
    engine = _engine(Faults(sjf_order="reversed"), scheduling_policy="fcfs")
    assert type(engine.scheduler.policy).__name__ == "FcfsPolicy"
    assert type(engine.executor) is SimulatedExecutor  # no delay planted: not wrapped


def test_the_reversed_policy_survives_a_scheduler_reset():
    engine = _engine(Faults(sjf_order="reversed"), scheduling_policy="sjf")
    assert isinstance(engine.scheduler.policy, ReversedPolicy)
    assert engine.scheduler.policy.name == "sjf"
    engine.reset_scheduler()
    assert isinstance(engine.scheduler.policy, ReversedPolicy)
