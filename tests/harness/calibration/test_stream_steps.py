"""An external engine's steps rebuilt from its streams (harness/calibration/stream_steps.py),
against a continuous-batching engine written for the tests (tests/support/
synthetic_streams.py) that says which steps really ran."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.cost_model import FEATURES, CostModel
from engine.sim.cost_fit import fit_cycles
from harness.calibration.stream_steps import StreamStepsError, rebuild
from tests.support.synthetic_streams import Request, run

TRUTH = CostModel.from_coefficients(
    [8e-3, 2e-5, 5e-4, 1e-6, 0.0, 0.0, 1e-3, 0.0, 0.0, 0.0], client_latency_s=0.0
)
COEFFICIENTS = dict(zip(FEATURES, TRUTH.coefficients, strict=True))


def _rebuild(requests, firsts, gaps, budget=2048, lagging=()):
    return rebuild(
        firsts,
        gaps,
        [r.prompt for r in requests],
        [r.cached for r in requests],
        budget,
        lagging,
    )


def _load(n: int, seed: int, rate: float = 20.0, max_prompt: int = 600) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    return [
        Request(
            float(a),
            int(rng.integers(16, max_prompt)),
            int(rng.integers(2, 60)),
            cached=int(rng.integers(0, 64)) if rng.random() < 0.3 else 0,
        )
        for a in arrivals
    ]


def _true_by_end(steps):
    return {round(s.end, 9): s for s in steps}


def test_every_measured_step_is_a_step_that_ran_with_its_batch_and_duration():
    requests = _load(120, seed=1)
    firsts, gaps, steps = run(requests, TRUTH)
    rebuilt = _rebuild(requests, firsts, gaps)
    truth = _true_by_end(steps)
    ends = rebuilt.starts + rebuilt.seconds
    assert len(rebuilt.seconds) > 300
    for end, features, seconds in zip(ends, rebuilt.features, rebuilt.seconds, strict=True):
        step = truth[round(float(end), 9)]
        assert tuple(features) == step.features
        assert seconds == pytest.approx(step.end - step.start, abs=1e-9)
    # every step that emitted a token was seen; those not measured followed an idle gap
    assert rebuilt.steps == sum(1 for s in steps if s.requests)
    assert rebuilt.steps == len(rebuilt.seconds) + rebuilt.steps_not_bounded
    assert rebuilt.streamed_requests == rebuilt.requests == 120


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 40),
    rate=st.floats(1.0, 200.0),
)
def test_rebuilt_steps_are_true_steps_whatever_the_load(seed, n, rate):
    """With no prompt split into chunks (a budget above any burst: where chunks fell is
    an approximation, tested apart), every measured step is exactly one that ran."""
    requests = _load(n, seed, rate)
    firsts, gaps, steps = run(requests, TRUTH, budget=32768, max_seqs=16)
    if not any(gaps):
        return  # every request asked a token or two and none decoded: nothing to rebuild
    rebuilt = _rebuild(requests, firsts, gaps, budget=32768)
    truth = _true_by_end(steps)
    for end, features in zip(rebuilt.starts + rebuilt.seconds, rebuilt.features, strict=True):
        assert tuple(features) == truth[round(float(end), 9)].features
    assert rebuilt.steps == len(rebuilt.seconds) + rebuilt.steps_not_bounded


def test_a_fit_of_rebuilt_steps_recovers_the_engine_despite_delivery_jitter():
    requests = _load(300, seed=7, rate=25.0)
    rng = np.random.default_rng(3)
    delays = rng.uniform(0, 4e-4, size=(300, 80))
    firsts, gaps, _ = run(requests, TRUTH, jitter=lambda i, k: float(delays[i, k]))
    rebuilt = _rebuild(requests, firsts, gaps)
    fitted = fit_cycles(rebuilt.features, rebuilt.seconds)
    for name in ("step_overhead_s", "prefill_token_s", "decode_seq_s", "decode_context_token_s"):
        assert getattr(fitted, name) == pytest.approx(COEFFICIENTS[name], rel=0.05), name
    assert fitted.fit["holdout_median_rel_error"] < 0.05


def test_a_long_prompt_is_prefilled_in_chunks_before_its_first_token():
    # one long prompt alone after a decoding request: its chunks ride in the decode's steps
    requests = [Request(0.0, 32, 40), Request(0.05, 900, 3)]
    firsts, gaps, steps = run(requests, TRUTH, budget=256)
    rebuilt = _rebuild(requests, firsts, gaps, budget=256)
    prefill = FEATURES.index("prefill_token_s")
    truth_total = sum(s.features[prefill] for s in steps if s.start >= 0.05)
    assert rebuilt.features[:, prefill].sum() == truth_total == 900
    chunks = rebuilt.features[:, prefill][rebuilt.features[:, prefill] > 0]
    assert len(chunks) == 4 and chunks.max() <= 255  # 255 = budget less the decode


def test_chunks_with_several_tokens_are_counted_and_not_placed():
    requests = [Request(0.0, 32, 10), Request(0.0, 40, 10)]
    firsts, gaps, _ = run(requests, TRUTH)
    gaps[1][3] = 0.0  # request 1's 4th and 5th tokens in one chunk
    gaps[1][4] += gaps[1][3] if gaps[1][3] else 0.0
    rebuilt = _rebuild(requests, firsts, gaps)
    assert rebuilt.coalesced_chunks == 1


def test_steps_that_started_while_the_load_generator_lagged_are_dropped():
    requests = _load(60, seed=2)
    firsts, gaps, _ = run(requests, TRUTH)
    whole = _rebuild(requests, firsts, gaps)
    middle = float(np.median(whole.starts))
    stretch = [(middle - 0.2, middle + 0.2)]
    cut = _rebuild(requests, firsts, gaps, lagging=stretch)
    inside = int(((whole.starts >= stretch[0][0]) & (whole.starts <= stretch[0][1])).sum())
    assert inside > 0
    assert cut.generator_limited_steps == inside
    assert len(cut.seconds) == len(whole.seconds) - inside


def test_requests_sent_to_an_idle_engine_are_the_lone_prefills():
    requests = [
        Request(0.0, 100, 5),
        Request(5.0, 200, 5),
        Request(5.001, 50, 5),  # arrives during the second's step: waits, then decodes beside
        Request(9.0, 30, 5),
        Request(9.0, 40, 5),  # arrives with the fourth: they share its step
    ]
    firsts, gaps, _ = run(requests, TRUTH)
    rebuilt = _rebuild(requests, firsts, gaps)
    assert [i for i, _ in rebuilt.lone_prefills] == [0, 1]
    prefill = FEATURES.index("prefill_token_s")
    assert [f[prefill] for _, f in rebuilt.lone_prefills] == [100, 200]


def test_records_without_a_stream_are_refused_with_the_reason():
    with pytest.raises(StreamStepsError, match="no request received a token"):
        rebuild([None, None], [[], []], [10, 10], [None, None], 2048)
    with pytest.raises(StreamStepsError, match="no request received a second token"):
        rebuild([1.0, 2.0], [[], []], [10, 10], [None, None], 2048)


def test_windows_add_up_consecutive_steps_and_cancel_the_jitter_inside_them():
    requests = _load(200, seed=5, rate=25.0)
    rng = np.random.default_rng(8)
    delays = rng.uniform(0, 2e-3, size=(200, 80))  # jitter of a quarter of a step
    firsts, gaps, steps = run(requests, TRUTH, jitter=lambda i, k: float(delays[i, k]))
    rebuilt = _rebuild(requests, firsts, gaps)
    features, seconds, starts = rebuilt.windows(8)
    assert features.sum(axis=0).tolist() == rebuilt.features.sum(axis=0).tolist()
    assert seconds.sum() == pytest.approx(rebuilt.seconds.sum())
    assert len(seconds) >= len(rebuilt.seconds) / 8
    # a window's duration is its true one within the jitter of its two ends
    priced = features @ np.array(TRUTH.coefficients)
    assert np.max(np.abs(seconds - priced)) < 2 * 2e-3 + 1e-9
    per_step = np.abs(rebuilt.seconds - rebuilt.features @ np.array(TRUTH.coefficients))
    assert np.median(np.abs(seconds - priced) / seconds) < np.median(per_step / rebuilt.seconds)
    with pytest.raises(ValueError, match="at least one step"):
        rebuilt.windows(0)


def test_a_client_that_read_late_costs_the_steps_it_blurred_and_nothing_else():
    """The client blocked for 150 ms, then read everything the server had sent meanwhile
    at once (10 us apart per chunk, as a busy load generator does): those chunks carried
    several steps' tokens; their steps and the ones after are not measured, and the fit
    is the engine's still."""
    requests = _load(300, seed=7, rate=25.0)
    firsts, gaps, _ = run(requests, TRUTH)
    blocked = (float(np.median([f for f in firsts if f is not None])), 0.15)
    late_firsts, late_gaps = [], []
    for first, row in zip(firsts, gaps, strict=True):
        times = np.cumsum([first, *row])
        start, length = blocked
        inside = (times > start) & (times < start + length)
        times[inside] = start + length + 1e-5 * np.arange(inside.sum())
        late_firsts.append(float(times[0]))
        late_gaps.append(np.diff(times).tolist())
    clean = _rebuild(requests, firsts, gaps)
    rebuilt = _rebuild(requests, late_firsts, late_gaps)
    assert rebuilt.coalesced_chunks > 0 and rebuilt.steps_read_late > 0
    assert clean.coalesced_chunks == clean.steps_read_late == 0
    assert len(rebuilt.seconds) < len(clean.seconds)
    features, seconds, _ = rebuilt.windows()
    fitted = fit_cycles(features, seconds, power=0.0)
    for name in ("step_overhead_s", "prefill_token_s", "decode_seq_s"):
        assert getattr(fitted, name) == pytest.approx(COEFFICIENTS[name], rel=0.05), name
