"""The torch executor: real computation over the paged KV cache, swap and recompute."""

from __future__ import annotations

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.clock import VirtualClock
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import SequenceStatus
from engine.factory import build_torch_engine
from engine.worker.model import build_model
from engine.worker.model_config import ModelConfig
from tests.support.device import device_under_test

pytestmark = [pytest.mark.torch_model]

# A model small enough for many steps on 2 cores, with GQA; random weights from a seed.
MODEL = ModelConfig(
    name="test",
    vocab_size=512,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    seed=3,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(MODEL, device_under_test())


def make_engine(model, scheduler: SchedulerConfig, cache: CacheConfig):
    config = EngineConfig(scheduler, cache, model="tiny")
    engine = build_torch_engine(config, VirtualClock(), device=model.device, model=model)
    return engine


def prompts(n: int) -> list[list[int]]:
    return [[(7 * i + 13 * j) % 500 + 3 for j in range(12 + 9 * i)] for i in range(n)]


def run(engine, params: SamplingParams, n: int = 6, max_steps: int = 5000):
    seqs = [engine.add_request(EngineRequest(f"r{i}", p, params)) for i, p in enumerate(prompts(n))]
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        engine.step()
        engine.scheduler.check_invariants()
    assert not engine.has_unfinished()
    return seqs


GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(model):
    """Every request alone, never preempted: the tokens it must always produce."""
    engine = make_engine(
        model,
        SchedulerConfig(max_num_seqs=1),
        CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
    )
    seqs = run(engine, GREEDY)
    assert all(s.num_preemptions == 0 for s in seqs)
    return [s.output_token_ids for s in seqs]


def test_outputs_are_not_degenerate(reference):
    assert all(len(tokens) == 40 for tokens in reference)
    assert len({tuple(t) for t in reference}) > 1  # different prompts, different outputs


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_is_lossless(model, reference, mode):
    """Greedy generation of preempted requests equals generation never preempted."""
    host = 64 if mode == "swap" else 0
    engine = make_engine(
        model,
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=32, preemption_mode=mode),
        CacheConfig(num_gpu_blocks_override=14, num_cpu_blocks_override=host),
    )
    seqs = run(engine, GREEDY)
    if mode == "swap":
        assert sum(s.num_preemptions_swap for s in seqs) > 0
    else:
        assert sum(s.num_preemptions_recompute for s in seqs) > 0
        assert sum(s.num_recomputed_tokens for s in seqs) > 0
    assert [s.output_token_ids for s in seqs] == reference


def test_chunked_prefill_and_batching_do_not_change_tokens(model, reference):
    engine = make_engine(
        model,
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=16),
        CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
    )
    seqs = run(engine, GREEDY)
    assert [s.output_token_ids for s in seqs] == reference


def test_seeded_sampling_is_reproducible_whatever_the_batch(model):
    params = SamplingParams(
        max_tokens=20, temperature=0.8, top_p=0.9, top_k=50, seed=11, ignore_eos=True
    )
    big = make_engine(
        model,
        SchedulerConfig(max_num_seqs=6),
        CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
    )
    alone = make_engine(
        model,
        SchedulerConfig(max_num_seqs=1),
        CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
    )
    a = [s.output_token_ids for s in run(big, params)]
    b = [s.output_token_ids for s in run(alone, params)]
    assert a == b
    greedy = [
        s.output_token_ids
        for s in run(
            make_engine(
                model,
                SchedulerConfig(),
                CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
            ),
            SamplingParams(max_tokens=20, ignore_eos=True),
        )
    ]
    assert a != greedy  # temperature really samples


def test_stop_tokens_and_min_tokens(model, reference):
    first = reference[0][0]
    # The first greedy token is a stop token: the request stops right there...
    engine = make_engine(
        model,
        SchedulerConfig(),
        CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
    )
    seq = engine.add_request(
        EngineRequest("s", prompts(1)[0], SamplingParams(max_tokens=40, stop_token_ids=(first,)))
    )
    while engine.has_unfinished():
        engine.step()
    assert seq.status is SequenceStatus.FINISHED_STOPPED
    assert seq.output_token_ids == [first]
    # ...unless min_tokens masks it: then the request never samples it before 5 tokens.
    engine = make_engine(
        model,
        SchedulerConfig(),
        CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
    )
    seq = engine.add_request(
        EngineRequest(
            "m", prompts(1)[0], SamplingParams(max_tokens=8, min_tokens=5, stop_token_ids=(first,))
        )
    )
    while engine.has_unfinished():
        engine.step()
    assert first not in seq.output_token_ids[:5]
    assert len(seq.output_token_ids) >= 5


def test_block_copies_move_kv_exactly(model):
    engine = make_engine(
        model, SchedulerConfig(), CacheConfig(num_gpu_blocks_override=8, num_cpu_blocks_override=8)
    )
    runner = engine.executor
    k, v = runner.device_cache[0]
    k[3].normal_()
    v[3].normal_()
    runner.copy_blocks([(3, 5)], to_host=True)
    hk, hv = runner.host_cache[0]
    assert torch.equal(hk[5], k[3].cpu()) and torch.equal(hv[5], v[3].cpu())
    runner.copy_blocks([(5, 1)], to_host=False)
    assert torch.equal(k[1], k[3]) and torch.equal(v[1], v[3])


def test_failed_step_fails_its_requests_and_the_engine_goes_on(model):
    engine = make_engine(
        model, SchedulerConfig(), CacheConfig(num_gpu_blocks_override=64, num_cpu_blocks_override=0)
    )
    runner = engine.executor
    real_execute = runner.execute
    calls = {"n": 0}

    def flaky(out):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fell over")
        return real_execute(out)

    runner.execute = flaky
    bad = engine.add_request(EngineRequest("bad", prompts(1)[0], GREEDY))
    engine.step()
    outcome = engine.step()
    assert outcome.error and "device fell over" in outcome.error
    assert bad.status is SequenceStatus.FINISHED_ERROR
    assert engine.block_manager.num_free_device_blocks == 64
    good = engine.add_request(
        EngineRequest("good", prompts(1)[0], SamplingParams(max_tokens=3, ignore_eos=True))
    )
    while engine.has_unfinished():
        engine.step()
    assert good.status is SequenceStatus.FINISHED_LENGTH


#: Sampling values that break down in float32 (the server refuses them with a 400; the
#: engine must not rely on it): top_p rounds to 0 and keeps no token; temperature
#: rounds to inf, and the tokens min_tokens bans give -inf / inf = nan.
POISONS = {
    "top_p_underflow": SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-46, seed=7),
    "temperature_overflow": SamplingParams(max_tokens=10, min_tokens=3, temperature=1e39),
}


def isolation_batch(poison: SamplingParams | None) -> list[tuple[str, list[int], SamplingParams]]:
    """Nine requests (one poisoned), or the same eight good ones (same prompts) alone."""
    good = [SamplingParams(max_tokens=10, ignore_eos=True) for _ in range(4)]
    good += [
        SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=40, seed=s, ignore_eos=True)
        for s in range(4)
    ]
    batch = [(f"g{i}", p) for i, p in enumerate(good)]
    batch.insert(4, ("poisoned", poison))
    return [
        (rid, prompt, params)
        for (rid, params), prompt in zip(batch, prompts(9), strict=True)
        if params is not None
    ]


@pytest.mark.parametrize("poison", POISONS.values(), ids=POISONS.keys())
def test_a_poisoned_request_fails_alone_and_its_batch_goes_on(model, poison):
    from engine.core import decisions as d

    def run_batch(poison):
        engine = make_engine(
            model,
            SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1024),
            CacheConfig(num_gpu_blocks_override=200, num_cpu_blocks_override=0),
        )
        records = []
        engine.observers.add(records.append)
        seqs = {
            rid: engine.add_request(EngineRequest(rid, prompt, params))
            for rid, prompt, params in isolation_batch(poison)
        }
        while engine.has_work():
            engine.step()
            engine.scheduler.check_invariants()  # blocks conserved, queues consistent
        bm = engine.block_manager
        assert bm.num_free_device_blocks == bm.num_device_blocks  # nothing leaked
        return seqs, records

    seqs, records = run_batch(poison)
    assert len(records[0].scheduled) == 9  # all nine in one batch
    assert all(r.error is None for r in records)  # no step failed as a whole
    bad = seqs.pop("poisoned")
    assert bad.finish_reason == "error" and bad.output_token_ids == []
    assert bad.error.startswith("sampling failed: ")
    fails = [(r.step, x) for r in records for x in r.decisions if x.kind == d.FAIL]
    assert [(step, x.request_id, x.reason, x.detail) for step, x in fails] == [
        (1, "poisoned", d.REASON_SAMPLING_ERROR, bad.error)
    ]
    assert bad in records[0].finished
    ended = [s.request_id for r in records for s in r.finished]
    assert sorted(ended) == sorted([*seqs, "poisoned"])  # each ends in exactly one record
    assert all(s.finish_reason == "length" and len(s.output_token_ids) == 10 for s in seqs.values())
    # ...and with exactly the tokens they get in a batch without the poisoned request.
    alone, _ = run_batch(None)
    assert {rid: s.output_token_ids for rid, s in seqs.items()} == {
        rid: s.output_token_ids for rid, s in alone.items()
    }


def test_a_planted_delay_wraps_the_torch_runner_and_really_sleeps(model, monkeypatch):
    """SCHEDSCOPE_FAULT on the torch executor (engine/faults.py): the runner computes as
    ever, then the step sleeps the planted delay on the wall clock. Not a timing
    assertion: the sleep is intercepted and its argument checked."""
    from engine.core.clock import WallClock
    from engine.delaying_executor import DelayingExecutor
    from engine.faults import Faults
    from engine.worker.model_runner import ModelRunner

    slept: list[float] = []
    monkeypatch.setattr("engine.delaying_executor.time.sleep", slept.append)
    config = EngineConfig(
        SchedulerConfig(), CacheConfig(block_size=4, num_gpu_blocks_override=32), model="tiny"
    )
    faults = Faults(prefill_token_delay_s=0.5, decode_step_delay_s=2.0)
    engine = build_torch_engine(config, WallClock(), device="cpu", model=model, faults=faults)
    assert isinstance(engine.executor, DelayingExecutor)
    assert isinstance(engine.executor.inner, ModelRunner)
    seq = engine.add_request(
        EngineRequest("r", [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    )
    engine.step()  # the prefill: 3 tokens
    engine.step()  # the decode
    assert slept == [1.5, 2.0]
    assert seq.status is SequenceStatus.FINISHED_LENGTH
