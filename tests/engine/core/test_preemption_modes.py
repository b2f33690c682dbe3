"""``--preemption-mode``: swap, recompute and auto are three different behaviours.

Scenario (priority policy): a long-context request L and a short-context request S
run; a high-priority request H arrives that needs nearly the whole device pool, so
both are preempted, worst (S) first. The cost model makes copies expensive and
re-prefill quadratic in context (``prefill_attention_s``): re-prefilling S's few
tokens is cheaper than swapping its block out and back, while swapping L's blocks is
cheaper than re-prefilling its long context.
"""

from __future__ import annotations

import pytest

from engine.core import decisions as d
from engine.core.cost_model import FEATURES, CostModel
from engine.core.sequence import SequenceStatus
from tests.support.engine_helpers import Req, drive, make_engine

COSTS = CostModel(
    **{
        **dict.fromkeys(FEATURES, 0.0),
        "step_overhead_s": 1 / 64,
        "prefill_token_s": 1e-6,
        "prefill_attention_s": 1e-6,
        "swap_block_s": 1e-4,
    }
)

L = Req("L", 0.0, prompt_len=60, max_tokens=20, priority=5)
S = Req("S", 0.0, prompt_len=3, max_tokens=20, priority=6)
H = Req("H", 0.05, prompt_len=70, max_tokens=2, priority=0)


def run(mode: str, cpu_blocks: int = 64):
    engine = make_engine(
        block_size=4,
        gpu_blocks=20,
        cpu_blocks=cpu_blocks,
        scheduling_policy="priority",
        preemption_mode=mode,
        cost_model=COSTS,
    )
    trace = drive(engine, [L, S, H])
    for_h = [x for x in trace.of(d.PREEMPT) if x.beneficiary == "H"]
    assert [x.request_id for x in for_h] == ["S", "L"], for_h  # worst first
    assert all(x.reason == d.REASON_PRIORITY for x in for_h)
    preempts = {x.request_id: x for x in for_h}
    for req in (L, S, H):  # nothing lost, whatever the mode
        seq = trace.seqs[req.id]
        assert seq.status is SequenceStatus.FINISHED_LENGTH
        assert seq.num_output_tokens == req.max_tokens
    return trace, preempts


def test_the_costs_really_differ_by_context_length():
    assert COSTS.predict_recompute_s(4) < COSTS.predict_swap_s(1)
    assert COSTS.predict_recompute_s(64) > COSTS.predict_swap_s(16)


def test_auto_recomputes_the_short_context_and_swaps_the_long_one():
    trace, preempts = run("auto")
    s, long_ = preempts["S"], preempts["L"]
    assert (s.mode, s.detail) == ("recompute", d.REASON_RECOMPUTE_CHEAPER)
    assert (long_.mode, long_.detail) == ("swap", d.REASON_SWAP_CHEAPER)
    # the decision carries both predictions, and they are the cost model's
    for x in (s, long_):
        seq = trace.seqs[x.request_id]
        assert x.predicted_swap_s == pytest.approx(COSTS.predict_swap_s(x.num_blocks))
        computed = x.num_tokens if x.mode == "recompute" else None
        if computed is not None:
            assert x.predicted_recompute_s == pytest.approx(COSTS.predict_recompute_s(computed))
        assert x.predicted_swap_s > 0 and x.predicted_recompute_s > 0
        assert seq.num_preemptions >= 1
    assert s.predicted_recompute_s < s.predicted_swap_s
    assert long_.predicted_swap_s < long_.predicted_recompute_s
    assert trace.of(d.SWAP_OUT, "L") and not trace.of(d.SWAP_OUT, "S")
    assert trace.seqs["S"].num_recomputed_tokens > 0 and trace.seqs["L"].num_recomputed_tokens == 0


def test_swap_swaps_both_whatever_they_cost():
    _, preempts = run("swap")
    assert {x.request_id: (x.mode, x.detail) for x in preempts.values()} == {
        "S": ("swap", ""),
        "L": ("swap", ""),
    }


def test_recompute_recomputes_both_whatever_they_cost():
    _, preempts = run("recompute")
    assert {x.request_id: (x.mode, x.detail) for x in preempts.values()} == {
        "S": ("recompute", ""),
        "L": ("recompute", ""),
    }


def test_auto_swaps_only_while_the_host_pool_has_room():
    """With no host pool, auto's cheaper choice for L (swap) is impossible: it
    recomputes, and says that swap space ran out; S recomputes because it is cheaper."""
    _, preempts = run("auto", cpu_blocks=0)
    assert (preempts["S"].mode, preempts["S"].detail) == ("recompute", d.REASON_RECOMPUTE_CHEAPER)
    assert (preempts["L"].mode, preempts["L"].detail) == (
        "recompute",
        d.REASON_SWAP_SPACE_EXHAUSTED,
    )
