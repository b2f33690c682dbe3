"""The sampler samples each row on its own: one request's values cannot break its batch.

A row whose numbers break down — a ``top_p`` that rounds to 0 in float32, a temperature
above float32 range over tokens banned by ``min_tokens`` (-inf / inf = nan), logits of
nan — yields an error for that row; every other row gets the token it would get in a
batch without it. (The server refuses such values with a 400; the engine must not
rely on it.)
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.worker.sampler import Sampler

VOCAB = 64
EOS = 2

#: Values that cannot be sampled in float32.
TOP_P_UNDERFLOW = SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-46, seed=5)
TEMPERATURE_OVERFLOW = SamplingParams(max_tokens=8, min_tokens=3, temperature=1e39, seed=6)
POISONS = (TOP_P_UNDERFLOW, TEMPERATURE_OVERFLOW)

GOOD = (
    SamplingParams(max_tokens=8),  # greedy
    SamplingParams(max_tokens=8, temperature=0.8, seed=1),
    SamplingParams(max_tokens=8, temperature=1.2, top_k=10, seed=2),
    SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=3),
    SamplingParams(max_tokens=8, min_tokens=2, temperature=1.0, top_p=0.5, top_k=20, seed=4),
)


def seqs_for(params: list[SamplingParams]) -> list[Sequence]:
    return [
        Sequence(EngineRequest(f"r{i}", [5, 6, 7], p, arrival_time=0.0), i)
        for i, p in enumerate(params)
    ]


def logits_for(seed: int, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=generator) * 3


def sample(params: list[SamplingParams], logits: torch.Tensor):
    # The sampler masks banned tokens in place: give it its own copy.
    return Sampler(EOS).sample(logits.clone(), seqs_for(params))


def test_a_poisoned_row_fails_alone_and_the_good_rows_are_unchanged():
    params = [GOOD[0], TOP_P_UNDERFLOW, GOOD[1], GOOD[2], TEMPERATURE_OVERFLOW, GOOD[3], GOOD[4]]
    logits = logits_for(0, len(params))
    out = sample(params, logits)
    assert set(out.errors) == {1, 4}
    assert out.token_ids[1] is None and out.token_ids[4] is None
    assert all(e.startswith("sampling failed: ") for e in out.errors.values())
    assert "no token has positive probability" in out.errors[1]
    assert "probability tensor contains inf/nan" in out.errors[4]
    good = [0, 2, 3, 5, 6]
    alone = sample([params[i] for i in good], logits[good])
    assert not alone.errors
    assert [out.token_ids[i] for i in good] == alone.token_ids


def test_a_greedy_row_of_nan_or_minus_inf_logits_fails_alone():
    logits = logits_for(1, 4)
    logits[1] = float("nan")
    logits[2] = float("-inf")
    logits[3, 7] = float("nan")  # one nan is enough to make the row meaningless
    greedy = SamplingParams(max_tokens=8)
    out = sample([greedy] * 4, logits)
    assert out.token_ids[0] == int(logits[0].argmax())
    assert out.token_ids[1:] == [None, None, None]
    assert set(out.errors) == {1, 2, 3}


def test_a_row_of_nan_logits_fails_a_sampled_row_alone():
    logits = logits_for(2, 2)
    logits[0] = float("nan")
    out = sample([GOOD[1], GOOD[2]], logits)
    assert out.token_ids[0] is None and "inf/nan" in out.errors[0]
    assert out.token_ids[1] == sample([GOOD[2]], logits[1:]).token_ids[0]


def test_a_failed_row_does_not_advance_its_generator():
    """The checks come before the draw: a failed seeded row consumes no randomness."""
    seq = seqs_for([TEMPERATURE_OVERFLOW])[0]
    Sampler(EOS).sample(logits_for(3, 1), [seq])
    assert seq.generator is None


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.booleans(), st.integers(0, len(GOOD) - 1), st.integers(0, len(POISONS) - 1)),
        min_size=1,
        max_size=9,
    ),
    seed=st.integers(0, 2**16),
)
def test_any_mix_of_poisoned_and_good_rows(rows, seed):
    params = [POISONS[p] if poisoned else GOOD[g] for poisoned, g, p in rows]
    logits = logits_for(seed, len(params))
    out = sample(params, logits)
    good = [i for i, (poisoned, _, _) in enumerate(rows) if not poisoned]
    assert set(out.errors) == set(range(len(rows))) - set(good)
    for i in good:
        token = out.token_ids[i]
        assert isinstance(token, int) and 0 <= token < VOCAB
    alone = sample([params[i] for i in good], logits[good]) if good else None
    assert [out.token_ids[i] for i in good] == (alone.token_ids if alone else [])


finite_or_not = st.one_of(
    st.floats(-50, 50, width=32), st.sampled_from([math.inf, -math.inf, math.nan])
)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), num_rows=st.integers(1, 6))
def test_the_sampler_never_raises_for_any_values(data, num_rows):
    """Any temperature, top_p, top_k and min_tokens, over any logits (nan and inf
    included): every row gets a token id in range or an error, never an exception."""
    vocab = 8
    params = [
        data.draw(
            st.builds(
                SamplingParams,
                max_tokens=st.just(4),
                min_tokens=st.integers(0, 4),
                temperature=st.one_of(st.just(0.0), st.floats(1e-320, 1e300)),
                top_p=st.floats(1e-320, 1.0),
                top_k=st.integers(-1, vocab + 2),
                seed=st.one_of(st.none(), st.integers(0, 100)),
                stop_token_ids=st.lists(st.integers(0, vocab - 1), max_size=3).map(tuple),
            )
        )
        for _ in range(num_rows)
    ]
    logits = torch.tensor(
        data.draw(
            st.lists(
                st.lists(finite_or_not, min_size=vocab, max_size=vocab),
                min_size=num_rows,
                max_size=num_rows,
            )
        ),
        dtype=torch.float32,
    )
    out = Sampler(EOS).sample(logits, seqs_for(params))
    assert len(out.token_ids) == num_rows
    for i, token in enumerate(out.token_ids):
        if token is None:
            assert out.errors[i].startswith("sampling failed: ")
        else:
            assert i not in out.errors and 0 <= token < vocab
