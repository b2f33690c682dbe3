"""The scheduler with prefix caching (vLLM V1's default): a shared prefix is computed
once, the token budget and the free-block test count only what is computed, a
recompute-preempted request re-hits what was not evicted, and the step records, the
decisions and vLLM's prefix-cache counters all say so."""

from __future__ import annotations

from engine.core import decisions as d
from engine.telemetry.metrics import install_metrics
from tests.support.engine_helpers import STEP_S, Req, drive, make_engine

LABELS = {"model_name": "tiny", "engine": "0"}
SHARED = tuple(range(100, 116))  # four full blocks of 4


def with_prefix(name: str, arrival: float, suffix: tuple[int, ...], max_tokens: int = 4) -> Req:
    prompt = SHARED + suffix
    return Req(name, arrival, len(prompt), max_tokens, prompt=prompt)


def test_a_shared_prefix_is_computed_once_and_only_the_rest_is_budgeted():
    engine = make_engine(block_size=4, gpu_blocks=32, max_num_batched_tokens=8)
    first = with_prefix("first", 0.0, (1, 2, 3))
    second = with_prefix("second", 20 * STEP_S, (4, 5, 6))
    trace = drive(engine, [first, second])
    admits = {x.request_id: x for x in trace.of(d.ADMIT)}
    assert admits["first"].num_cached_tokens == 0
    assert admits["second"].num_cached_tokens == 16
    ran = engine.executor.scheduled_per_seq
    assert ran["first"] == 19 + 3  # its prompt, then 3 decodes
    assert ran["second"] == 3 + 3  # only its suffix: one step under the budget of 8
    assert trace.seqs["second"].num_cached_tokens == 16
    admit_step = trace.step_of(admits["second"])
    assert admit_step.num_cached_tokens == 16 and admit_step.num_prefill_tokens == 3


def test_same_step_admissions_share_what_the_first_registers():
    """Two requests arriving together: the first's prompt blocks are registered when its
    prefill is scheduled, so the second, admitted after it in the same step, hits them
    (the executor writes every new token's KV before attention reads the cache)."""
    engine = make_engine(block_size=4, gpu_blocks=32)
    trace = drive(engine, [with_prefix("a", 0.0, (1,)), with_prefix("b", 0.0, (2,))])
    admits = {x.request_id: x for x in trace.of(d.ADMIT)}
    assert admits["a"].step == admits["b"].step
    assert admits["b"].num_cached_tokens == 16


def test_a_recompute_re_hits_what_was_not_evicted():
    """x (22 computed tokens: 5 full blocks) is recompute-preempted for the better y,
    which takes the free blocks and evicts x's cached blocks from x's tail; x's
    re-admission finds the 4 blocks left and recomputes only the rest."""
    engine = make_engine(
        block_size=4,
        gpu_blocks=12,
        cpu_blocks=0,
        scheduling_policy="priority",
        preemption_mode="recompute",
    )
    x = Req("x", 0.0, prompt_len=17, max_tokens=12, priority=2)
    y = Req("y", 6 * STEP_S, prompt_len=28, max_tokens=2, priority=1)
    trace = drive(engine, [x, y])
    preempt = next(iter(trace.of(d.PREEMPT, "x")))
    recompute = next(iter(trace.of(d.RECOMPUTE, "x")))
    assert preempt.num_tokens == 22 and recompute.num_cached_tokens == 16
    assert recompute.num_evicted_prefix_tokens == 4  # its fifth block, evicted for y
    assert sum(step.num_evicted_blocks for step in trace.steps) > 0
    seq = trace.seqs["x"]
    assert seq.num_recomputed_tokens == preempt.num_tokens - recompute.num_cached_tokens


def test_the_counters_say_what_was_queried_hit_and_computed():
    engine = make_engine(block_size=4, gpu_blocks=32)
    metrics = install_metrics(engine, "tiny")
    reqs = [with_prefix(f"r{i}", i * 10 * STEP_S, (i + 1, i + 2)) for i in range(3)]
    trace = drive(engine, reqs)

    def value(name: str, **labels) -> float:
        return metrics.registry.get_sample_value(name, {**LABELS, **labels}) or 0.0

    prompts = sum(len(r.prompt or ()) for r in reqs)
    cached = sum(x.num_cached_tokens for x in trace.of(d.ADMIT))
    assert cached == 2 * 16
    assert value("vllm:prefix_cache_queries_total") == prompts
    assert value("vllm:prefix_cache_hits_total") == cached
    assert value("vllm:prompt_tokens_cached_total") == cached
    assert value("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached
    assert value("vllm:prompt_tokens_by_source_total", source="local_compute") == prompts - cached
    assert value("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert value("vllm:prompt_tokens_total") == prompts
    assert value("vllm:gpu_prefix_cache_hit_rate") == cached / prompts


def test_with_caching_off_nothing_is_queried():
    engine = make_engine(block_size=4, gpu_blocks=32, enable_prefix_caching=False)
    metrics = install_metrics(engine, "tiny")
    reqs = [with_prefix(f"r{i}", i * 10 * STEP_S, (i + 1,)) for i in range(2)]
    trace = drive(engine, reqs)
    assert all(x.num_cached_tokens == 0 for x in trace.of(d.ADMIT))
    assert metrics.registry.get_sample_value("vllm:prefix_cache_queries_total", LABELS) == 0
    assert engine.executor.scheduled_per_seq["r1"] == 17 + 3
