"""Load profiles: distributions, arrivals, determinism, class mix, loading."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    ProfileError,
    RequestClass,
    Slo,
    build_plan,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    resolve_profile,
    sample_requests,
)
from tests.support.paths import REPO

REPO = REPO
N = 200_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def make_profile(phases: list[Phase], classes: list[RequestClass] | None = None, **kw) -> Profile:
    classes = classes or [
        RequestClass(
            name="a",
            weight=0.8,
            prompt_tokens=LengthDistribution.lognormal(200, 0.6, max=1024),
            output_tokens=LengthDistribution.geometric(50),
            max_tokens=128,
        ),
        RequestClass(
            name="b",
            weight=0.2,
            priority=1,
            prompt_tokens=LengthDistribution.uniform(400, 600),
            output_tokens=LengthDistribution.lognormal(300, 0.5),
        ),
    ]
    return Profile(
        name=kw.pop("name", "t"), seed=kw.pop("seed", 1), classes=classes, phases=phases, **kw
    )


# -- distributions -----------------------------------------------------------------


def test_fixed():
    x = LengthDistribution.fixed(37).sample(rng(), 1000)
    assert x.dtype == np.int64 and x.shape == (1000,)
    assert (x == 37).all()


def test_uniform_covers_both_ends():
    x = LengthDistribution.uniform(10, 20).sample(rng(), N)
    assert x.min() == 10 and x.max() == 20
    assert abs(x.mean() - 15) < 0.05
    assert len(np.unique(x)) == 11


def test_normal_mean_and_std():
    x = LengthDistribution.normal(500, 50).sample(rng(), N)
    assert abs(x.mean() - 500) < 1.0
    assert abs(x.std() - 50) < 1.0


def test_lognormal_is_parameterised_by_median():
    x = LengthDistribution.lognormal(200, 0.6).sample(rng(), N)
    assert abs(np.median(x) - 200) < 3
    # mean = median * exp(sigma^2 / 2): tells the median apart from the mean.
    assert abs(x.mean() - 200 * np.exp(0.18)) < 3
    assert abs(np.log(x).std() - 0.6) < 0.01


def test_exponential_mean():
    x = LengthDistribution.exponential(100).sample(rng(), N)
    assert abs(x.mean() / 100 - 1) < 0.02


def test_geometric_support_starts_at_one():
    x = LengthDistribution.geometric(5).sample(rng(), N)
    assert x.min() == 1
    assert abs(x.mean() - 5) < 0.05
    assert abs((x == 1).mean() - 0.2) < 0.005  # P(X=1) = p = 1/mean
    assert (LengthDistribution.geometric(1).sample(rng(), 100) == 1).all()


def test_empirical_inline_values():
    x = LengthDistribution.empirical([10, 20, 30]).sample(rng(), N)
    values, counts = np.unique(x, return_counts=True)
    assert values.tolist() == [10, 20, 30]
    assert np.allclose(counts / N, 1 / 3, atol=0.005)


def test_empirical_file_skips_header_blank_and_comments(tmp_path):
    f = tmp_path / "lengths.csv"
    f.write_text("tokens,other\n5,x\n\n# a comment\n7,y\n9\n")
    d = LengthDistribution.empirical(file=f)
    assert d.values == (5, 7, 9)
    assert set(d.sample(rng(), 1000).tolist()) == {5, 7, 9}


def test_empirical_file_bad_line(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("5\nseven\n")
    with pytest.raises(ProfileError, match=r"line 2.*'seven'"):
        LengthDistribution.empirical(file=f)


def test_clipping_to_min_and_max():
    x = LengthDistribution.lognormal(200, 1.0, min=50, max=300).sample(rng(), N)
    assert x.min() == 50 and x.max() == 300
    # Clipped mass sits on the bounds instead of being redrawn.
    assert (x == 300).mean() > 0.3
    # A normal far below 1 still yields lengths >= 1.
    assert LengthDistribution.normal(1, 10).sample(rng(), N).min() == 1


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"kind": "gama", "mean": 1}, "kind: unknown distribution 'gama'"),
        ({"kind": "lognormal", "median": 10, "sigma": 0.5, "mean": 3}, "mean: not a parameter"),
        ({"kind": "lognormal", "median": 10}, "sigma: required"),
        ({"kind": "geometric", "mean": 0.5}, "mean: a geometric"),
        ({"kind": "uniform", "low": 10, "high": 5}, "high: must be >= 10"),
        ({"kind": "fixed", "value": 5, "min": 10, "max": 5}, "max: must be >= 10"),
        ({"kind": "fixed", "value": 5, "min": 0}, "min: must be >= 1"),
        ({"kind": "normal", "mean": 5, "std": float("nan")}, "std: must be finite"),
        ({"kind": "empirical", "values": (1, 2), "file": "x"}, "exactly one of"),
        ({"kind": "empirical", "values": (1, 0)}, r"values\[1\]: must be >= 1"),
        ({"kind": "fixed", "value": True}, "value: expected a number"),
    ],
)
def test_distribution_validation(kwargs, key):
    with pytest.raises(ProfileError, match=key):
        LengthDistribution(**kwargs)


@st.composite
def distributions(draw):
    kind = draw(
        st.sampled_from(
            ["fixed", "uniform", "normal", "lognormal", "exponential", "geometric", "empirical"]
        )
    )
    lo = draw(st.integers(1, 5000))
    hi = draw(st.one_of(st.none(), st.integers(lo, 10_000)))
    clip = {"min": lo, "max": hi}
    pos = st.floats(0.01, 1e5)
    if kind == "fixed":
        return LengthDistribution.fixed(draw(pos), **clip)
    if kind == "uniform":
        a = draw(st.integers(1, 10_000))
        return LengthDistribution.uniform(a, draw(st.integers(a, 20_000)), **clip)
    if kind == "normal":
        return LengthDistribution.normal(draw(pos), draw(st.floats(0, 1e4)), **clip)
    if kind == "lognormal":
        return LengthDistribution.lognormal(draw(pos), draw(st.floats(0, 3)), **clip)
    if kind == "exponential":
        return LengthDistribution.exponential(draw(pos), **clip)
    if kind == "geometric":
        return LengthDistribution.geometric(draw(st.floats(1, 1e5)), **clip)
    return LengthDistribution.empirical(
        draw(st.lists(st.integers(1, 10**6), min_size=1, max_size=20)), **clip
    )


@settings(max_examples=300, deadline=None)
@given(distributions(), st.integers(0, 2**32 - 1), st.integers(0, 500))
def test_samples_are_ints_within_bounds(dist, seed, n):
    x = dist.sample(np.random.default_rng(seed), n)
    assert x.dtype == np.int64 and x.shape == (n,)
    assert (x >= max(dist.min, 1)).all()
    if dist.max is not None:
        assert (x <= dist.max).all()
    if dist.upper is not None:
        assert (x <= dist.upper).all()


# -- arrivals ----------------------------------------------------------------------


def test_poisson_count_and_burstiness():
    rate, duration = 50.0, 400.0
    profile = make_profile(
        [
            Phase(name="poisson", duration_s=duration, rate=rate),
            Phase(name="bursty", duration_s=duration, rate=rate, burstiness=0.25),
        ]
    )
    plan = build_plan(profile)
    poisson, bursty = plan.phases
    expected = rate * duration
    # Count variance is about expected / burstiness; allow 5 sigma.
    assert abs(len(poisson.requests) - expected) < 5 * np.sqrt(expected)
    assert abs(len(bursty.requests) - expected) < 5 * np.sqrt(expected / 0.25)

    def cv(phase):
        gaps = np.diff([r.scheduled_at for r in phase.requests])
        return gaps.std() / gaps.mean()

    assert abs(cv(poisson) - 1.0) < 0.05  # exponential gaps
    assert abs(cv(bursty) - 2.0) < 0.15  # gamma shape 0.25: CV = 1/sqrt(0.25)
    assert cv(bursty) > cv(poisson)


def test_open_phase_times_within_bounds_and_sorted():
    profile = make_profile(
        [
            Phase(name="a", duration_s=7.3, rate=20),
            Phase(name="b", duration_s=2.1, rate=80, burstiness=0.1),
            Phase(name="c", duration_s=5, concurrency=3),
            Phase(name="d", duration_s=4, rate=10),
        ]
    )
    plan = build_plan(profile)
    assert [p.start_s for p in plan.phases] == pytest.approx([0, 7.3, 9.4, 14.4])
    assert [p.end_s for p in plan.phases] == pytest.approx([7.3, 9.4, 14.4, 18.4])
    # Contiguous by construction: no gap or overlap from float rounding.
    assert all(a.end_s == b.start_s for a, b in itertools.pairwise(plan.phases))
    assert plan.duration_s == pytest.approx(profile.duration_s) == pytest.approx(18.4)
    for p in plan.phases:
        assert all(p.start_s <= r.scheduled_at < p.end_s for r in p.requests)
        assert all(r.phase == p.index for r in p.requests)
    times = [r.scheduled_at for r in plan.open_loop_requests()]
    assert times == sorted(times)
    assert [r.index for r in plan.open_loop_requests()] == list(range(plan.num_open_requests))
    assert plan.phases[2].kind == "closed" and plan.phases[2].concurrency == 3
    assert plan.phases[2].requests == []
    assert plan.phase_at(0).index == 0
    assert plan.phase_at(10).index == 2 and plan.phase_at(18.4) is None


# -- determinism -------------------------------------------------------------------


def _spec_tuples(specs):
    return [dataclasses.astuple(s) for s in specs]


def test_same_seed_same_schedule_and_different_seed_differs():
    profile = make_profile(
        [
            Phase(name="a", duration_s=60, rate=5),
            Phase(name="b", duration_s=10, rate=30, burstiness=0.3),
        ]
    )
    first = build_plan(profile).open_loop_requests()
    assert _spec_tuples(first) == _spec_tuples(build_plan(profile, seed=1).open_loop_requests())
    other = build_plan(profile, seed=2).open_loop_requests()
    assert [r.scheduled_at for r in other[:20]] != [r.scheduled_at for r in first[:20]]
    assert [r.prompt_tokens for r in other[:20]] != [r.prompt_tokens for r in first[:20]]
    assert other[0].request_id == "t-2-0000000" and first[0].request_id == "t-1-0000000"


_DIGEST_SCRIPT = (
    """
import hashlib, dataclasses
from harness.profiles import build_plan, resolve_profile
p = resolve_profile("default")
"""
    "h = hashlib.sha256(repr([dataclasses.astuple(s) "
    "for s in build_plan(p).open_loop_requests()]).encode())\n"
    """print(h.hexdigest())
"""
)


def test_schedule_is_identical_across_processes():
    digests = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST_SCRIPT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_editing_one_phase_leaves_the_others_draws_alone():
    a = make_profile(
        [Phase(name="a", duration_s=30, rate=5), Phase(name="b", duration_s=30, rate=5)]
    )
    b = make_profile(
        [
            Phase(name="a", duration_s=30, rate=5),
            Phase(name="b", duration_s=30, rate=9, burstiness=0.5),
        ]
    )
    pa, pb = build_plan(a), build_plan(b)
    assert _spec_tuples(pa.phases[0].requests) == _spec_tuples(pb.phases[0].requests)
    assert _spec_tuples(pa.phases[1].requests) != _spec_tuples(pb.phases[1].requests)


def test_closed_phase_kth_spec_is_stable():
    profile = make_profile(
        [
            Phase(name="open", duration_s=10, rate=5),
            Phase(name="closed", duration_s=10, concurrency=4),
        ]
    )
    sequential = build_plan(profile).phases[1]
    specs = [sequential.next_request() for _ in range(700)]
    random_access = build_plan(profile).phases[1]
    for k in (650, 3, 256, 255, 699, 0):
        assert random_access.request_at(k) == specs[k]
    assert all(
        s.scheduled_at is None and s.phase == 1 and s.index == k for k, s in enumerate(specs)
    )
    assert len({s.prompt_tokens for s in specs}) > 50  # not one chunk repeated
    with pytest.raises(ValueError):
        build_plan(profile).phases[0].next_request()


def test_ids_unique_across_open_and_closed_phases():
    profile = make_profile(
        [
            Phase(name="a", duration_s=20, rate=10),
            Phase(name="b", duration_s=10, concurrency=2),
            Phase(name="c", duration_s=20, rate=10),
            Phase(name="d", duration_s=10, concurrency=2),
        ]
    )
    plan = build_plan(profile)
    ids = [r.request_id for r in plan.open_loop_requests()]
    for phase in (plan.phases[1], plan.phases[3]):
        ids += [phase.next_request().request_id for _ in range(600)]
    assert len(ids) == len(set(ids))


# -- class mix ---------------------------------------------------------------------


def test_class_mix_follows_weights_and_lengths_follow_class():
    profile = make_profile([Phase(name="a", duration_s=2000, rate=20)])
    specs = sample_requests(profile, 40_000)
    names = np.array([s.class_name for s in specs])
    assert abs((names == "a").mean() - 0.8) < 0.01
    a = [s for s in specs if s.class_name == "a"]
    b = [s for s in specs if s.class_name == "b"]
    assert all(s.priority == 0 and s.max_tokens == 128 and 1 <= s.output_tokens <= 128 for s in a)
    assert all(s.prompt_tokens <= 1024 for s in a)
    # max_tokens unset: the client sends the sampled length.
    assert all(
        s.priority == 1 and s.max_tokens == s.output_tokens and 400 <= s.prompt_tokens <= 600
        for s in b
    )


def test_per_phase_weight_override():
    profile = make_profile(
        [
            Phase(name="only_a", duration_s=500, rate=20, classes={"b": 0}),
            Phase(name="mostly_b", duration_s=500, rate=20, classes={"a": 1, "b": 3}),
        ]
    )
    only_a, mostly_b = build_plan(profile).phases
    assert {r.class_name for r in only_a.requests} == {"a"}
    frac_b = np.mean([r.class_name == "b" for r in mostly_b.requests])
    assert abs(frac_b - 0.75) < 0.03
    with pytest.raises(ProfileError, match=r"phases\[0\]\.classes: unknown class 'c'"):
        make_profile([Phase(name="x", duration_s=1, rate=1, classes={"c": 1})])
    with pytest.raises(ProfileError, match=r"phases\[0\]\.classes: every class has weight 0"):
        make_profile([Phase(name="x", duration_s=1, rate=1, classes={"a": 0, "b": 0})])


# -- sample_requests ---------------------------------------------------------------


def test_sample_requests_100k_sorted_unique():
    # Its speed is measured by benchmarks/bench_profiles.py, not bounded here.
    profile = resolve_profile("default")
    specs = sample_requests(profile, 100_000)
    assert len(specs) == 100_000
    times = np.array([s.scheduled_at for s in specs])
    assert (np.diff(times) >= 0).all()
    assert len({s.request_id for s in specs}) == 100_000
    assert [s.index for s in specs[:5]] == [0, 1, 2, 3, 4]
    # Cycles of the phase pattern: the long-run rate is the profile's average rate.
    plan = build_plan(profile)
    assert 100_000 / times[-1] == pytest.approx(
        sum(p.rate * p.duration_s for p in profile.phases) / profile.duration_s, rel=0.05
    )
    # The first cycle is the plan; shorter samples are prefixes.
    n = plan.num_open_requests
    assert _spec_tuples(specs[:n]) == _spec_tuples(plan.open_loop_requests())
    assert _spec_tuples(sample_requests(profile, 1234)) == _spec_tuples(specs[:1234])


def test_sample_requests_skips_closed_phases_and_needs_an_open_one():
    profile = make_profile(
        [Phase(name="c", duration_s=5, concurrency=2), Phase(name="o", duration_s=5, rate=10)]
    )
    specs = sample_requests(profile, 200)
    assert {s.phase for s in specs} == {1}
    assert sample_requests(profile, 0) == []
    with pytest.raises(ProfileError, match="no open-loop"):
        sample_requests(make_profile([Phase(name="c", duration_s=5, concurrency=2)]), 10)


# -- model validation --------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"rate": 1, "concurrency": 2}, "exactly one of `rate`.*`concurrency`"),
        ({}, "exactly one of"),
        ({"rate": 0}, "rate: must be > 0"),
        ({"rate": 1, "burstiness": 0}, "burstiness: must be > 0"),
        ({"concurrency": 2, "burstiness": 0.5}, "burstiness: applies to open-loop"),
        ({"concurrency": 0}, "concurrency: must be >= 1"),
        ({"concurrency": 1.5}, "concurrency: expected an integer"),
        ({"rate": 1, "classes": {"a": -1}}, "classes.a: must be >= 0"),
    ],
)
def test_phase_validation(kwargs, key):
    with pytest.raises(ProfileError, match=key):
        Phase(name="p", duration_s=1, **kwargs)


def test_class_and_profile_validation():
    d = LengthDistribution.fixed(5)
    with pytest.raises(ProfileError, match="weight: must be > 0"):
        RequestClass(name="a", weight=0, prompt_tokens=d, output_tokens=d)
    with pytest.raises(ProfileError, match="max_tokens: 3 is below output_tokens.min"):
        RequestClass(
            name="a",
            prompt_tokens=d,
            output_tokens=LengthDistribution.fixed(5, min=4),
            max_tokens=3,
        )
    with pytest.raises(ProfileError, match="ttft_s: must be > 0"):
        Slo(ttft_s=0)
    with pytest.raises(ProfileError, match="name: expected a name"):
        RequestClass(name="has space", prompt_tokens=d, output_tokens=d)
    c = RequestClass(name="a", prompt_tokens=d, output_tokens=d)
    phase = Phase(name="p", duration_s=1, rate=1)
    with pytest.raises(ProfileError, match=r"classes\[1\]\.name: duplicate class name 'a'"):
        Profile(name="x", seed=0, classes=[c, c], phases=[phase])
    with pytest.raises(ProfileError, match="phases: at least one"):
        Profile(name="x", seed=0, classes=[c], phases=[])
    with pytest.raises(ProfileError, match="seed: must be >= 0"):
        Profile(name="x", seed=-1, classes=[c], phases=[phase])


# -- loading -----------------------------------------------------------------------


def test_default_profile_loads_and_fits_the_engine():
    profile = resolve_profile("default")  # an alias of the mixed profile
    assert profile == resolve_profile("mixed") == load_profile(REPO / "loadprofiles" / "mixed.py")
    assert profile.name == "mixed"
    assert [c.name for c in profile.classes] == ["short_chat", "long_generation"]
    assert [p.name for p in profile.phases] == ["steady", "burst", "recovery"]
    assert profile.duration_s == 120
    assert all(
        c.max_total_tokens is not None and c.max_total_tokens <= 2048 for c in profile.classes
    )
    steady, burst, _ = profile.phases
    assert burst.rate > 2 * steady.rate and burst.burstiness < 1
    assert profile_from_dict(profile_to_dict(profile)) == profile


def test_python_example_loads():
    profile = resolve_profile("default_py_example")
    assert profile.name == "default_py_example"
    assert {p.kind for p in profile.phases} == {"open", "closed"}
    assert profile_from_dict(profile_to_dict(profile)) == profile


def test_python_profile_as_dict_leaves_no_trace(tmp_path):
    (tmp_path / "lengths.txt").write_text("11\n22\n")
    path = tmp_path / "mine.py"
    path.write_text(
        textwrap.dedent(
            """
            PROFILE = {
                "name": "mine", "seed": 3,
"""
            '                "classes": [{"name": "a", '
            '"prompt_tokens": {"kind": "empirical", "file": "lengths.txt"},\n'
            """                             "output_tokens": 16}],
                "phases": [{"name": "p", "duration_s": 5, "rate": 2}],
            }
            """
        )
    )
    modules, sys_path = set(sys.modules), list(sys.path)
    profile = load_profile(path)
    assert set(sys.modules) == modules and sys.path == sys_path
    assert profile.classes[0].prompt_tokens.values == (11, 22)
    assert profile.classes[0].output_tokens == LengthDistribution.fixed(16)


@pytest.mark.parametrize(
    "source, message",
    [
        ("X = 1\n", "PROFILE: the file defines no module-level PROFILE"),
        ("PROFILE = 42\n", "PROFILE: expected a Profile or a dict"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
        ("PROFILE = {'name': 'x'}\n", "seed: required key missing"),
    ],
)
def test_python_profile_errors(tmp_path, source, message):
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(ProfileError, match=message) as e:
        load_profile(path)
    assert str(path) in str(e.value)


VALID_TOML = """
name = "t"
seed = 1
[[classes]]
name = "a"
prompt_tokens = { kind = "fixed", value = 10 }
output_tokens = { kind = "fixed", value = 10 }
[[classes]]
name = "b"
weight = 2
prompt_tokens = { kind = "uniform", low = 1, high = 5 }
output_tokens = { kind = "lognormal", median = 10, sigma = 0.5 }
[[phases]]
name = "p"
duration_s = 10
rate = 1
"""


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_toml_loads(tmp_path):
    profile = load_profile(write(tmp_path, VALID_TOML))
    assert profile.classes[1].weight == 2.0 and profile.phases[0].rate == 1.0


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("seed = 1", "sede = 1", r"sede: unknown key for a profile .*did you mean 'seed'"),
        ("weight = 2", "weigth = 2", r"classes\[1\]\.weigth: unknown key for a class"),
        ("weight = 2", 'weight = "heavy"', r"classes\[1\]\.weight: expected a number, got 'heavy'"),
        (
            'kind = "lognormal"',
            'kind = "gama"',
            r"classes\[1\]\.output_tokens\.kind: unknown distribution 'gama' "
            r"\(expected one of fixed, ",
        ),
        (
            "sigma = 0.5",
            "sigma = 0.5, mean = 3",
            r"classes\[1\]\.output_tokens\.mean: unknown key for a lognormal distribution",
        ),
        ("sigma = 0.5", "sigm = 0.5", r"classes\[1\]\.output_tokens\.sigm: unknown key"),
        (
            "rate = 1",
            "rate = 1\nconcurrency = 4",
            r"phases\[0\]\.rate: a phase takes exactly one of `rate`.*`concurrency`",
        ),
        ("rate = 1", "rate = 1\nclasses = { c = 1 }", r"phases\[0\]\.classes: unknown class 'c'"),
        ("rate = 1", "rat = 1", r"phases\[0\]\.rat: unknown key for a phase .*did you mean 'rate'"),
        ('name = "p"', "", r"phases\[0\]\.name: required key missing"),
        (
            'prompt_tokens = { kind = "fixed", value = 10 }',
            'prompt_tokens = "ten"',
            r"classes\[0\]\.prompt_tokens: expected a table",
        ),
        (
            'output_tokens = { kind = "fixed", value = 10 }',
            'output_tokens = { kind = "fixed", value = 10 }\nslo = { ttf_s = 1 }',
            r"classes\[0\]\.slo\.ttf_s: unknown key",
        ),
    ],
)
def test_toml_errors_name_the_key(tmp_path, old, new, message):
    assert old in VALID_TOML
    path = write(tmp_path, VALID_TOML.replace(old, new, 1))
    with pytest.raises(ProfileError, match=message) as e:
        load_profile(path)
    assert str(e.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    "new, message",
    [
        # each was accepted and ended in a MemoryError (72.8 TiB for 1e12)
        ("rate = 1e12", r"phases: about 10,000,000,000,000 requests expected .* 1,000,000"),
        ("duration_s = 3600\nrate = 1e6", r"phases: about 3,600,000,000 requests expected"),
        ("concurrency = 1000000000", r"phases\[0\]\.concurrency: must be <= 10,000"),
    ],
)
def test_absurd_loads_are_refused_naming_the_key(tmp_path, new, message):
    text = VALID_TOML.replace("duration_s = 10\nrate = 1", "duration_s = 10\n" + new, 1)
    text = text.replace("duration_s = 10\nduration_s = 3600", "duration_s = 3600")
    with pytest.raises(ProfileError, match=message):
        load_profile(write(tmp_path, text))


def test_a_rate_scale_that_asks_for_too_many_requests_is_refused(tmp_path):
    profile = load_profile(write(tmp_path, VALID_TOML))
    with pytest.raises(ProfileError, match="requests expected"):
        profile.with_rate_scale(1e9)


def test_dict_structure_errors():
    base = {"name": "x", "seed": 0, "phases": [{"name": "p", "duration_s": 1, "rate": 1}]}
    with pytest.raises(
        ProfileError, match=r"classes: expected an array of tables \(\[\[classes\]\]\)"
    ):
        profile_from_dict({**base, "classes": 3})
    with pytest.raises(ProfileError, match=r"classes\[0\]: expected a table"):
        profile_from_dict({**base, "classes": ["a"]})
    with pytest.raises(ProfileError, match="classes: at least one is required"):
        profile_from_dict({**base, "classes": []})


def test_file_level_errors(tmp_path):
    with pytest.raises(ProfileError, match="no such profile file") as e:
        load_profile(tmp_path / "missing.toml")
    assert "missing.toml" in str(e.value)
    with pytest.raises(ProfileError, match=r"unsupported profile file type '\.yaml'"):
        load_profile(write(tmp_path, "name: x", "p.yaml"))
    with pytest.raises(ProfileError, match="invalid TOML"):
        load_profile(write(tmp_path, "name = \n", "broken.toml"))
    with pytest.raises(ProfileError, match=r"no shipped profile of that name \(shipped: .*default"):
        resolve_profile("no_such_profile")


def test_empirical_file_resolves_against_the_profile_dir(tmp_path, monkeypatch):
    sub = tmp_path / "profiles"
    sub.mkdir()
    (sub / "lens.txt").write_text("100\n200\n300\n")
    path = write(
        sub,
        VALID_TOML.replace(
            '{ kind = "uniform", low = 1, high = 5 }', '{ kind = "empirical", file = "lens.txt" }'
        ),
    )
    monkeypatch.chdir(tmp_path)
    profile = resolve_profile(str(path.relative_to(tmp_path)))
    assert profile.classes[1].prompt_tokens.values == (100, 200, 300)
    (sub / "lens.txt").unlink()
    with pytest.raises(ProfileError, match=r"classes\[1\]\.prompt_tokens\.file: cannot read"):
        load_profile(path)


def test_rate_scale():
    profile = resolve_profile("default")
    scaled = profile.with_rate_scale(2.0)
    assert [p.rate for p in scaled.phases] == [2 * p.rate for p in profile.phases]
    assert scaled.classes == profile.classes


def test_import_stays_light():
    code = "import sys, harness.profiles, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    modules = set(json.loads(out.stdout))
    assert not {"torch", "asyncio", "polars"} & modules
