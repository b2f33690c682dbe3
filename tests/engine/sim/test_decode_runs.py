"""Decode runs (``engine.sim.decode_runs``): the pieces they are made of hold to what
plain stepping computes, bit for bit, and a run ends requests as ``Scheduler.update``
would (EOS from ``min_tokens`` on, ``ignore_eos``, the length limits)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import FEATURES, CostModel, CostModelError
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.token_timing import RunTokenTimes, TokenTiming
from engine.factory import build_simulated_engine
from engine.sim.decode_runs import can_start, run_decodes, supports_decode_runs

costs = st.one_of(st.just(0.0), st.floats(0, 1, allow_subnormal=False))


@settings(deadline=None)  # no timing: a busy machine must not fail it
@given(
    coefficients=st.lists(costs, min_size=len(FEATURES), max_size=len(FEATURES)),
    num_seqs=st.integers(0, 512),
    context=st.integers(0, 10**6),
)
def test_predict_decode_step_is_predict_bit_for_bit(coefficients, num_seqs, context):
    model = CostModel.from_coefficients(coefficients)
    expected = model.predict(0, num_seqs, context)
    assert model.predict_decode_step(num_seqs, context) == expected
    assert model.decode_step_predictor()(num_seqs, context) == expected


@settings(deadline=None)
@given(
    last=st.floats(0, 100),
    gaps=st.lists(st.sampled_from([0.0, 0.001, 0.1, 0.25, 0.2500001, 0.7, 3.0]), min_size=1),
    before=st.lists(st.floats(0.0, 1.0), max_size=3),
    data=st.data(),
)
def test_run_token_times_apply_is_add_token_at_each_step(last, gaps, before, data):
    """A request that joins the run at any step and leaves at its latest step."""
    times, t = [], last
    for gap in gaps:
        t += gap
        times.append(t)
    first = data.draw(st.integers(0, len(times) - 1))
    run = RunTokenTimes()
    for at in times:
        run.add_step(at)

    def fresh() -> TokenTiming:
        timing = TokenTiming()
        at = times[first - 1] if first else last
        at -= sum(before)
        timing.add_token(at)
        for gap in before:
            at += gap
            timing.add_token(at)
        return timing

    stepped, applied = fresh(), fresh()
    for at in times[first:]:
        stepped.add_token(at)
    run.apply(applied, first, len(times) - first)
    for name in TokenTiming.__slots__:
        assert getattr(applied, name) == getattr(stepped, name), name


def _engine(block_size: int, num_blocks: int):
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=8),
        CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks),
    )
    cost = CostModel(step_overhead_s=0.001, decode_seq_s=0.0002, decode_context_token_s=1e-6)
    return build_simulated_engine(config, cost)


requests = st.lists(
    st.tuples(
        st.integers(1, 40),  # prompt
        st.integers(1, 30),  # max_tokens
        st.integers(0, 30),  # min_tokens (clipped to max_tokens)
        st.booleans(),  # ignore_eos
        st.one_of(st.none(), st.integers(1, 40)),  # oracle output length
        st.floats(0, 0.05),  # arrival gap
    ),
    min_size=1,
    max_size=10,
)


class _Rows:
    """A run's sink (and plain steps' records) as comparable rows, one per step."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self._ended: dict[int, tuple[str, ...]] = {}

    def step(self, record, num_seqs: int) -> None:
        self.rows.append(
            (
                record.step,
                record.schedule_start,
                record.token_time,
                num_seqs,
                record.num_decode_seqs,
                record.num_decode_context_tokens,
                record.num_free_device_blocks,
                record.num_prefill_tokens,
                len(record.decisions),
                tuple(s.request_id for s in record.finished),
            )
        )

    def ended(self, step: int, seqs) -> None:
        self._ended[step] = tuple(s.request_id for s in seqs)

    def decode_steps(self, steps) -> None:
        for k, start in enumerate(steps.starts):
            number = steps.first_step + k
            num = steps.num_seqs[k]
            self.rows.append(
                (
                    number,
                    start,
                    steps.ends[k],
                    num,
                    num,
                    steps.context_tokens[k],
                    steps.free_device_blocks[k],
                    0,
                    0,
                    self._ended.pop(number, ()),
                )
            )


def _drive(engine, specs, runs: bool, admit_in_runs: bool = False):
    """Add ``specs`` at their arrival times and step (with decode runs or without) until
    done; returns the rows of every step and the final state of every request.
    ``admit_in_runs``: a run admits the arrivals itself rather than stopping."""
    pending = []
    at = 0.0
    for i, (prompt, max_tokens, min_tokens, ignore_eos, oracle, gap) in enumerate(specs):
        at += gap
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens), ignore_eos=ignore_eos
        )
        pending.append(
            EngineRequest(
                f"r{i}", [5] * prompt, params, arrival_time=at, oracle_output_tokens=oracle
            )
        )
    sink, seqs = _Rows(), []
    run_steps = 0

    def next_arrival():
        return pending[0].arrival_time if pending else None

    def admit(now):
        while pending and pending[0].arrival_time <= now:
            seqs.append(engine.add_request(pending.pop(0)))

    clock = engine.clock
    while pending or engine.has_work():
        admit(clock.now())
        if engine.has_work():
            if runs and can_start(engine):
                taken = run_decodes(
                    engine, next_arrival, sink, admit=admit if admit_in_runs else None
                )
                run_steps += taken
                if taken:
                    continue
            record = engine.step()
            sink.step(record, len(record.scheduled))
        else:
            clock.advance_to(pending[0].arrival_time)
    final = [
        (
            s.request_id,
            s.status,
            s.num_tokens,
            s.num_computed_tokens,
            tuple(s.output_token_ids),
            s.finished_time,
            s.timing.first_token_time,
            s.timing.last_token_time,
            s.timing.max_itl_s,
            tuple(s.timing.long_gaps),
            tuple(s.block_table),
        )
        for s in seqs
    ]
    return sink.rows, final, run_steps


@settings(max_examples=30, deadline=None)
@given(
    specs=requests,
    block_size=st.sampled_from([1, 2, 16]),
    num_blocks=st.integers(10, 60),
    admit_in_runs=st.booleans(),
)
def test_runs_end_requests_and_take_blocks_as_plain_steps_do(
    specs, block_size, num_blocks, admit_in_runs
):
    fast = _engine(block_size, num_blocks)
    assert supports_decode_runs(fast)
    rows, final, _ = _drive(fast, specs, runs=True, admit_in_runs=admit_in_runs)
    plain_rows, plain_final, _ = _drive(_engine(block_size, num_blocks), specs, runs=False)
    assert rows == plain_rows
    assert final == plain_final


def test_runs_take_the_steps_of_an_unchanging_batch():
    """Four requests admitted together, then decoding with nothing else to do: every
    step is one run's, the admission and prefill step included."""
    specs = [(8, 30, 0, False, 20 + i, 0.0) for i in range(4)]
    rows, _, run_steps = _drive(_engine(4, 60), specs, runs=True)
    assert len(rows) == 23  # one prefill step, then 19-22 decode steps
    assert run_steps == 23


def test_a_run_carries_a_queue_through_its_admissions():
    """Twelve requests at once, four slots: a queue waits while the first four decode.
    Every step is one run's — each admission the scheduler's own, the decodes supplied —
    and the steps are those of plain stepping."""
    specs = [(8 + i, 30, 0, False, 5 + i % 4, 0.0) for i in range(12)]
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=4), CacheConfig(block_size=4, num_gpu_blocks_override=60)
    )
    cost = CostModel(step_overhead_s=0.001, decode_seq_s=0.0002, decode_context_token_s=1e-6)
    rows, final, run_steps = _drive(build_simulated_engine(config, cost), specs, runs=True)
    plain_rows, plain_final, _ = _drive(build_simulated_engine(config, cost), specs, runs=False)
    assert rows == plain_rows and final == plain_final
    assert run_steps == len(rows)
    assert sum(row[8] for row in rows) >= 12  # the admissions' decisions are in its steps


def test_an_infinite_price_never_reaches_the_engine():
    """An infinite price would make the clock infinite and a run's gaps ``inf - inf``;
    the cost model refuses it when it is made, so every engine's prices are finite."""
    config = EngineConfig(SchedulerConfig(max_num_seqs=8))
    assert supports_decode_runs(build_simulated_engine(config, CostModel()))
    with pytest.raises(CostModelError, match="decode_seq_s"):
        CostModel(decode_seq_s=float("inf"))
