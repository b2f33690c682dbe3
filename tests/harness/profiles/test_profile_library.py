"""The profile library (loadprofiles/) and the schedule's statistics: Poisson counts,
gamma burstiness, class mix, ramps, trace replay, and every shipped profile run
shortened in the simulator.

Statistical checks use one fixed seed each, so they are deterministic; the bounds
are the stated confidence intervals (normal approximations at large n), so a change
that biases the sampler fails them, while a reseed would pass ~99% of the time.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    ProfileError,
    ReplayTrace,
    RequestClass,
    RequestSpec,
    build_plan,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    resolve_profile,
    sample_requests,
    shipped_profile_names,
)
from harness.profiles.loader import ALIASES, shipped_profiles_dir
from tests.support.paths import REPO

REPO = REPO
Z99 = 2.5758  # two-sided 99% normal quantile
# Upper 99.9% points of the chi-square distribution, by degrees of freedom.
CHI2_999 = {19: 43.82, 29: 58.30, 39: 72.05}

REQUIRED = {"mixed", "burst", "ramp", "spike", "priority", "starvation", "swap_pressure", "replay"}


def classes(*weights: float) -> tuple[RequestClass, ...]:
    return tuple(
        RequestClass(
            name=f"c{i}",
            weight=w,
            priority=i,
            prompt_tokens=LengthDistribution.uniform(10 + i, 100 + i),
            output_tokens=LengthDistribution.geometric(20, max=200),
            max_tokens=200,
        )
        for i, w in enumerate(weights)
    )


def profile(*phases: Phase, weights=(0.8, 0.2), seed: int = 3, name: str = "t") -> Profile:
    return Profile(name=name, seed=seed, classes=classes(*weights), phases=phases)


def times_of(plan) -> np.ndarray:
    return np.array([r.scheduled_at for r in plan.open_loop_requests()])


# -- open-loop statistics ----------------------------------------------------------


def test_poisson_count_within_99ci_and_windows_are_poisson():
    rate, duration = 20.0, 500.0
    t = times_of(build_plan(profile(Phase(name="p", duration_s=duration, rate=rate))))
    expected = rate * duration
    assert abs(t.size - expected) < Z99 * math.sqrt(expected)
    # Counts in 1 s windows: Poisson(20) each, so the index of dispersion is ~1:
    # (k-1) * var/mean is chi-square with k-1 dof -> 99% band around k-1 = 499.
    counts = np.histogram(t, bins=int(duration), range=(0, duration))[0]
    dispersion = counts.var(ddof=1) / counts.mean()
    band = Z99 * math.sqrt(2 / (counts.size - 1))
    assert abs(dispersion - 1) < band, dispersion


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_gamma_burstiness_gives_the_intended_cv(burstiness):
    rate, duration = 50.0, 1000.0  # ~50,000 gaps
    plan = build_plan(
        profile(Phase(name="p", duration_s=duration, rate=rate, burstiness=burstiness))
    )
    gaps = np.diff(times_of(plan))
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)


def test_class_mix_within_binomial_99ci():
    weights = (0.6, 0.3, 0.1)
    specs = sample_requests(
        profile(Phase(name="p", duration_s=100, rate=50), weights=weights), 60_000
    )
    names = np.array([s.class_name for s in specs])
    n = names.size
    for i, w in enumerate(weights):
        p_hat = (names == f"c{i}").mean()
        assert abs(p_hat - w) < Z99 * math.sqrt(w * (1 - w) / n), (i, p_hat)


def test_determinism_by_seed_for_rate_ramp_and_closed_phases():
    p = profile(
        Phase(name="a", duration_s=20, rate=5, burstiness=0.5),
        Phase(name="r", duration_s=20, rate=1, rate_end=9),
        Phase(name="c", duration_s=5, concurrency=2),
    )

    def fingerprint(seed):
        plan = build_plan(p, seed)
        closed = [dataclasses.astuple(plan.phases[2].request_at(k)) for k in range(20)]
        return [dataclasses.astuple(s) for s in plan.open_loop_requests()], closed

    assert fingerprint(7) == fingerprint(7)
    a, b = fingerprint(7), fingerprint(8)
    at = [f.name for f in dataclasses.fields(RequestSpec)].index("scheduled_at")
    assert [s[at] for s in a[0]][:30] != [s[at] for s in b[0]][:30]  # times differ
    assert [s[4] for s in a[1]] != [s[4] for s in b[1]]  # closed prompts differ


# -- ramps -------------------------------------------------------------------------


@pytest.mark.parametrize("r0, r1", [(0.5, 8.0), (8.0, 0.5), (2.0, 30.0)])
def test_ramp_counts_per_window_follow_the_linear_rate(r0, r1):
    duration = 400.0
    windows = 20
    # Many repetitions of one ramp give enough arrivals per window.
    p = profile(
        *(Phase(name=f"r{k}", duration_s=duration, rate=r0, rate_end=r1) for k in range(10))
    )
    plan = build_plan(p)
    edges = np.linspace(0, duration, windows + 1)
    observed = np.zeros(windows)
    for phase in plan.phases:
        t = np.array([r.scheduled_at for r in phase.requests]) - phase.start_s
        observed += np.histogram(t, bins=edges)[0]
    slope = (r1 - r0) / duration
    cum = r0 * edges + slope * edges**2 / 2
    expected = 10 * np.diff(cum)
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < CHI2_999[windows - 1], (chi2, observed, expected)
    # The total is inside its 99% Poisson CI too.
    total = expected.sum()
    assert abs(observed.sum() - total) < Z99 * math.sqrt(total)


@pytest.mark.parametrize("burstiness", [1.0, 0.25])
def test_ramp_keeps_burstiness_in_rescaled_time(burstiness):
    # Time-rescaling: the gaps of Lambda(t_i) are the unit-mean gamma gaps.
    r0, r1, d = 1.0, 40.0, 2000.0
    plan = build_plan(
        profile(Phase(name="r", duration_s=d, rate=r0, rate_end=r1, burstiness=burstiness))
    )
    t = times_of(plan)
    u = r0 * t + (r1 - r0) / d * t**2 / 2
    gaps = np.diff(u)
    assert gaps.mean() == pytest.approx(1.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_ramp_phase_validation_and_serialization():
    with pytest.raises(ProfileError, match="rate_end: a ramp needs `rate`"):
        Phase(name="x", duration_s=5, concurrency=2, rate_end=3)
    with pytest.raises(ProfileError, match="rate_end: must be > 0"):
        Phase(name="x", duration_s=5, rate=1, rate_end=0)
    with pytest.raises(ProfileError, match="duration_s: required"):
        Phase(name="x", rate=1)
    ramp = Phase(name="x", duration_s=10, rate=1, rate_end=5)
    assert ramp.rate_at(0) == 1 and ramp.rate_at(5) == 3 and ramp.rate_at(10) == 5
    assert ramp.expected_requests == 30 and ramp.arrivals == "ramp"
    p = profile(ramp)
    d = profile_to_dict(p)
    assert d["phases"][0]["rate_end"] == 5.0
    assert profile_from_dict(d) == p
    scaled = p.with_rate_scale(2)
    assert (scaled.phases[0].rate, scaled.phases[0].rate_end) == (2, 10)


def test_ramp_in_toml(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(
        'name = "r"\nseed = 1\n[[classes]]\nname = "a"\nprompt_tokens = 10\noutput_tokens = 10\n'
        '[[phases]]\nname = "ramp"\nduration_s = 60\nrate = 0.5\nrate_end = 8\n'
    )
    p = load_profile(path)
    assert p.phases[0].rate_end == 8.0
    n = build_plan(p).num_open_requests
    assert abs(n - 255) < Z99 * math.sqrt(255)


def test_duration_scale():
    p = profile(
        Phase(name="a", duration_s=60, rate=4),
        Phase(name="r", duration_s=40, rate=1, rate_end=5),
        Phase(name="c", duration_s=10, concurrency=3),
    )
    short = p.with_duration_scale(0.25)
    assert [ph.duration_s for ph in short.phases] == [15, 10, 2.5]
    assert [ph.rate for ph in short.phases] == [ph.rate for ph in p.phases]
    assert short.phases[1].rate_end == 5
    with pytest.raises(ProfileError, match="duration_scale: must be > 0"):
        p.with_duration_scale(0)


# -- hypothesis: invariants of any plan --------------------------------------------


@st.composite
def phases(draw):
    kind = draw(st.sampled_from(["rate", "ramp", "closed"]))
    duration = draw(st.floats(0.1, 30))
    name = f"p{draw(st.integers(0, 10**6))}"
    if kind == "closed":
        return Phase(name=name, duration_s=duration, concurrency=draw(st.integers(1, 4)))
    rate = draw(st.floats(0.1, 40))
    b = draw(st.sampled_from([0.1, 0.5, 1.0, 3.0]))
    if kind == "ramp":
        return Phase(
            name=name,
            duration_s=duration,
            rate=rate,
            rate_end=draw(st.floats(0.1, 40)),
            burstiness=b,
        )
    return Phase(name=name, duration_s=duration, rate=rate, burstiness=b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(phases(), min_size=1, max_size=4), st.integers(0, 2**31))
def test_plan_invariants(phase_list, seed):
    p = Profile(name="h", seed=0, classes=classes(0.5, 0.3, 0.2), phases=tuple(phase_list))
    plan = build_plan(p, seed)
    specs = plan.open_loop_requests()
    t = [s.scheduled_at for s in specs]
    assert t == sorted(t)
    for ph in plan.phases:
        assert all(ph.start_s <= r.scheduled_at < ph.end_s for r in ph.requests)
    ids = [s.request_id for s in specs]
    for ph in plan.phases:
        if ph.kind == "closed":
            ids += [ph.request_at(k).request_id for k in range(3)]
    assert len(ids) == len(set(ids))
    for s in specs:
        rc = p.request_class(s.class_name)
        assert rc.prompt_tokens.low <= s.prompt_tokens <= rc.prompt_tokens.high
        assert 1 <= s.output_tokens <= s.max_tokens == 200
        assert s.priority == rc.priority


# -- replay ------------------------------------------------------------------------

AZURE_ROWS = [
    ("2023-11-16 18:15:46.6805900", 374, 44),
    ("2023-11-16 18:15:50.9951690", 396, 109),
    ("2023-11-16 18:15:51.0000001", 879, 55),
    ("2023-11-16 18:16:06.4186170", 91, 16),
    ("2023-11-16 18:16:06.4186170", 381, 84),  # same instant
]
AZURE_OFFSETS = [0.0, 4.314579, 4.3194101, 19.738027, 19.738027]


def write_csv(path: Path, header: list[str], rows: list[tuple]) -> Path:
    import csv

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_jsonl(path: Path, header: list[str], rows: list[tuple]) -> Path:
    path.write_text("".join(json.dumps(dict(zip(header, r, strict=True))) + "\n" for r in rows))
    return path


def replay_profile(trace: ReplayTrace, **phase_kw) -> Profile:
    return Profile(
        name="rp",
        seed=0,
        classes=classes(1.0, 1.0),
        phases=(Phase(name="t", trace=trace, **phase_kw),),
    )


def check_replay(p: Profile, offsets, prompts, outputs, time_scale=1.0, cls=None):
    specs = build_plan(p).open_loop_requests()
    assert [s.scheduled_at for s in specs] == pytest.approx(
        [o / time_scale for o in offsets], abs=1e-9
    )
    assert np.diff([s.scheduled_at for s in specs]) == pytest.approx(
        np.diff(offsets) / time_scale, abs=1e-9
    )
    assert [s.prompt_tokens for s in specs] == list(prompts)
    assert [s.output_tokens for s in specs] == list(outputs)
    assert [s.max_tokens for s in specs] == list(outputs)
    if cls is not None:
        assert [s.class_name for s in specs] == list(cls)
    return specs


@pytest.mark.parametrize("writer, suffix", [(write_csv, "csv"), (write_jsonl, "jsonl")])
def test_replay_azure_layout_exact(tmp_path, writer, suffix):
    path = writer(
        tmp_path / f"azure.{suffix}", ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], AZURE_ROWS
    )
    trace = ReplayTrace(file=path)
    assert trace.layout == "azure"
    p = replay_profile(trace)
    specs = check_replay(
        p, AZURE_OFFSETS, [r[1] for r in AZURE_ROWS], [r[2] for r in AZURE_ROWS], cls=["c0"] * 5
    )
    assert {s.priority for s in specs} == {0}
    fast = replay_profile(ReplayTrace(file=path, time_scale=2.0))
    check_replay(fast, AZURE_OFFSETS, [r[1] for r in AZURE_ROWS], [r[2] for r in AZURE_ROWS], 2.0)
    # --rate-scale on a trace phase is its speed.
    check_replay(
        p.with_rate_scale(4.0),
        AZURE_OFFSETS,
        [r[1] for r in AZURE_ROWS],
        [r[2] for r in AZURE_ROWS],
        4.0,
    )


BURSTGPT_HEADER = [
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
]
BURSTGPT_ROWS = [
    (5.0, "ChatGPT", 472, 18, 490, "Conversation log"),
    (45.0, "ChatGPT", 1087, 0, 1087, "Conversation log"),  # failed: skipped
    (47.25, "GPT-4", 417, 276, 693, "Conversation log"),
    (51.5, "ChatGPT", 1360, 161, 1521, "API log"),
    (51.75, "ChatGPT", 300, 20, 320, "Conversation log"),
]


@pytest.mark.parametrize("writer, suffix", [(write_csv, "csv"), (write_jsonl, "jsonl")])
def test_replay_burstgpt_layout_filters_and_skips(tmp_path, writer, suffix):
    path = writer(tmp_path / f"burst.{suffix}", BURSTGPT_HEADER, BURSTGPT_ROWS)
    trace = ReplayTrace(file=path, default_class="c1")
    assert trace.layout == "burstgpt" and trace.num_skipped == 1
    kept = [r for r in BURSTGPT_ROWS if r[3] > 0]
    specs = check_replay(
        replay_profile(trace),
        [r[0] - 5.0 for r in kept],
        [r[2] for r in kept],
        [r[3] for r in kept],
        cls=["c1"] * 4,
    )
    assert {s.priority for s in specs} == {1}
    chatgpt = [r for r in kept if r[1] == "ChatGPT" and r[5] == "Conversation log"]
    filtered = ReplayTrace(file=path, model="ChatGPT", log_type="Conversation log")
    check_replay(
        replay_profile(filtered),
        [r[0] - 5.0 for r in chatgpt],
        [r[2] for r in chatgpt],
        [r[3] for r in chatgpt],
    )


PLAIN_ROWS = [
    (10.0, 100, 10, "c1"),
    (10.5, 200, 20, ""),
    (12.0, 300, 30, "c0"),
    (11.0, 400, 40, "c1"),
    (20.0, 500, 50, "c0"),
]


@pytest.mark.parametrize("writer, suffix", [(write_csv, "csv"), (write_jsonl, "jsonl")])
@pytest.mark.parametrize("time_col", ["arrival_s", "timestamp"])
def test_replay_plain_layout_classes_start_and_limit(tmp_path, writer, suffix, time_col):
    path = writer(
        tmp_path / f"plain.{suffix}",
        [time_col, "prompt_tokens", "output_tokens", "class"],
        PLAIN_ROWS,
    )
    trace = ReplayTrace(file=path)
    assert trace.layout == "plain"
    # Sorted by time (the row at 11.0 comes before 12.0); an empty class is the default.
    order = sorted(PLAIN_ROWS, key=lambda r: r[0])
    check_replay(
        replay_profile(trace),
        [r[0] - 10 for r in order],
        [r[1] for r in order],
        [r[2] for r in order],
        cls=[r[3] or "c0" for r in order],
    )
    # start_s skips trace seconds (before scaling); limit keeps the first n after it.
    part = ReplayTrace(file=path, start_s=0.75, limit=2, time_scale=0.5)
    check_replay(replay_profile(part), [0.0, 1.0], [400, 300], [40, 30], 0.5, cls=["c1", "c0"])


def test_replay_phase_window_and_duration_scale(tmp_path):
    path = write_csv(
        tmp_path / "t.csv",
        ["arrival_s", "prompt_tokens", "output_tokens"],
        [(float(i), 10, 5) for i in range(11)],
    )
    p = replay_profile(ReplayTrace(file=path))
    # Default duration: the span (10 s) plus one mean gap.
    assert p.phases[0].duration_s == 11.0
    assert build_plan(p).num_open_requests == 11
    assert build_plan(p.with_duration_scale(0.5)).num_open_requests == 6  # t < 5.5
    cut = replay_profile(ReplayTrace(file=path), duration_s=3.0)
    assert [s.scheduled_at for s in build_plan(cut).open_loop_requests()] == [0.0, 1.0, 2.0]
    # A trace phase after another phase starts at that phase's end.
    two = Profile(
        name="x",
        seed=0,
        classes=classes(1.0),
        phases=(Phase(name="warm", duration_s=5, rate=2), Phase(name="t", trace=p.phases[0].trace)),
    )
    replayed = build_plan(two).phases[1].requests
    assert [r.scheduled_at for r in replayed] == pytest.approx([5.0 + i for i in range(11)])
    # sample_requests cycles the trace.
    specs = sample_requests(p, 25)
    assert [s.scheduled_at for s in specs[11:14]] == pytest.approx([11.0, 12.0, 13.0])
    assert len({s.request_id for s in specs}) == 25


def write_toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_replay_in_toml_relative_path_and_round_trip(tmp_path):
    write_csv(
        tmp_path / "trace.csv",
        ["arrival_s", "prompt_tokens", "output_tokens", "class"],
        [(0.0, 10, 5, "a"), (0.5, 20, 6, "b")],
    )
    path = tmp_path / "replay.toml"
    path.write_text(
        'name = "r"\nseed = 0\n'
        '[[classes]]\nname = "a"\nprompt_tokens = 10\noutput_tokens = 10\n'
        '[[classes]]\nname = "b"\npriority = 3\nprompt_tokens = 10\noutput_tokens = 10\n'
        '[[phases]]\nname = "t"\ntrace = { file = "trace.csv", time_scale = 2.0 }\n'
    )
    p = load_profile(path)
    specs = build_plan(p).open_loop_requests()
    assert [(s.scheduled_at, s.class_name, s.priority) for s in specs] == [
        (0.0, "a", 0),
        (0.25, "b", 3),
    ]
    assert profile_from_dict(profile_to_dict(p)) == p
    # Shorthand: a bare path is a trace at its defaults.
    short = load_profile(
        write_toml(
            path,
            path.read_text().replace(
                'trace = { file = "trace.csv", time_scale = 2.0 }', 'trace = "trace.csv"'
            ),
        )
    )
    assert [s.scheduled_at for s in build_plan(short).open_loop_requests()] == [0.0, 0.5]
    bad = (
        path.read_text()
        .replace('trace = "trace.csv"', 'trace = { file = "trace.csv", time_scale = 2.0 }')
        .replace("time_scale", "time_scal")
    )
    path.write_text(bad)
    with pytest.raises(ProfileError, match=r"phases\[0\]\.trace\.time_scal: unknown key"):
        load_profile(path)


@pytest.mark.parametrize(
    "header, rows, suffix, message",
    [
        (
            ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
            [("2023-11-16 18:15:46.5", 1, 2), ("yesterday", 3, 4)],
            "csv",
            r"line 3, column 'TIMESTAMP': expected a datetime",
        ),
        (
            ["Timestamp", "Request tokens", "Response tokens"],
            [(1.0, 5, 2), (2.0, "many", 4)],
            "csv",
            r"line 3, column 'Request tokens': expected an integer, got 'many'",
        ),
        (
            ["arrival_s", "prompt_tokens", "output_tokens"],
            [(1.0, 5, 2), (2.0, 5, -4)],
            "jsonl",
            r"line 2, column 'output_tokens': must be >= 0",
        ),
        (
            ["arrival_s", "prompt_tokens", "output_tokens"],
            [(1.0, 5, 2), ("", 5, 4)],
            "csv",
            r"line 3, column 'arrival_s': missing value",
        ),
        (
            ["arrival_s", "prompt_tokens", "output_tokens", "class"],
            [(1.0, 5, 2, "c0"), (2.0, 5, 4, "nosuch")],
            "csv",
            r"line 3, column 'class': 'nosuch' is not a class",
        ),
        (
            ["when", "prompt", "output"],
            [(1.0, 5, 2)],
            "csv",
            r"line 2: cannot tell the trace layout",
        ),
        (["arrival_s", "prompt_tokens", "output_tokens"], [(1.0, 0, 2)], "csv", "no requests"),
    ],
)
def test_replay_errors_name_file_line_and_column(tmp_path, header, rows, suffix, message):
    writer = write_csv if suffix == "csv" else write_jsonl
    path = writer(tmp_path / f"bad.{suffix}", header, rows)
    with pytest.raises(ProfileError, match=message) as e:
        replay_profile(ReplayTrace(file=path))
    assert str(path) in str(e.value)


def test_replay_validation(tmp_path):
    path = write_csv(
        tmp_path / "t.csv", ["arrival_s", "prompt_tokens", "output_tokens"], [(0, 1, 1)]
    )
    with pytest.raises(ProfileError, match="cannot read"):
        ReplayTrace(file=tmp_path / "missing.csv")
    with pytest.raises(ProfileError, match="format: unknown trace format 'azur'"):
        ReplayTrace(file=path, format="azur")
    with pytest.raises(ProfileError, match="time_scale: must be > 0"):
        ReplayTrace(file=path, time_scale=0)
    with pytest.raises(ProfileError, match="classes: a trace phase takes its classes"):
        Phase(name="t", trace=ReplayTrace(file=path), classes={"c0": 1})
    with pytest.raises(ProfileError, match="exactly one of"):
        Phase(name="t", trace=ReplayTrace(file=path), rate=1, duration_s=1)
    with pytest.raises(ProfileError, match=r"trace\.default_class: unknown class 'zz'"):
        replay_profile(ReplayTrace(file=path, default_class="zz"))
    with pytest.raises(ProfileError, match="start_s: no arrivals"):
        ReplayTrace(file=path, start_s=5)


# -- the shipped library -----------------------------------------------------------


def test_library_has_the_required_profiles_and_the_default_alias():
    names = set(shipped_profile_names())
    assert REQUIRED <= names and "default" in names
    assert ALIASES == {"default": "mixed"}
    assert "default" not in shipped_profile_names(aliases=False)
    assert resolve_profile("default") == resolve_profile("mixed")


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_profile_file_shape(name):
    path = shipped_profiles_dir() / f"{name}.py"
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 400, "every profile says what it is for"
    lowered = doc.lower()
    assert "what it is for" in lowered and "capacity it assumes" in lowered
    assert "simulator" in lowered or "measured" in lowered
    last = tree.body[-1]
    assert ast.unparse(last) == "expose(PROFILE, globals())"
    p = load_profile(path)
    assert p.name == name and p.description


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_profile_fits_the_default_max_model_len(name):
    p = resolve_profile(name)
    for c in p.classes:
        assert c.max_total_tokens is not None and c.max_total_tokens <= 2048, c.name
    if any(ph.trace is not None for ph in p.phases):
        specs = build_plan(p).open_loop_requests()
        assert max(s.prompt_tokens + s.max_tokens for s in specs) <= 2048


def _simulate(p, policy="fcfs", **knobs):
    from engine.core.cost_model import CostModel
    from harness.serve.knobs import build_engine_config
    from harness.simulate.driver import simulate

    config = build_engine_config({**knobs, "scheduling_policy": policy})
    return simulate(p, config, CostModel(), record_decisions=False)


@pytest.mark.parametrize("name", sorted(set(shipped_profile_names())))
def test_every_shipped_profile_runs_shortened_in_the_simulator(name):
    p = resolve_profile(name).with_duration_scale(0.1)
    plan = build_plan(p)
    assert plan.duration_s == pytest.approx(resolve_profile(name).duration_s * 0.1)
    result = _simulate(p, "priority")
    frame = result.requests
    turns = [t for session in plan.sessions() for t in session.turns]
    planned = plan.num_open_requests + len(turns)
    assert frame.height >= planned > 0 or name == "default_py_example"
    assert frame["status"].eq("ok").all()
    planned_ids = {s.request_id for s in plan.open_loop_requests() + turns}
    assert set(frame["request_id"]) >= planned_ids


def test_starvation_sjf_starves_long_requests_and_max_wait_fixes_it():
    p = resolve_profile("starvation").with_duration_scale(0.7)

    def long_wait(**knobs):
        f = _simulate(p, **knobs).requests
        q = f.filter(f["class"] == "long")["queue_s"]
        return q.max(), q.quantile(0.99)

    starved_max, starved_p99 = long_wait(policy="sjf")
    bounded_max, bounded_p99 = long_wait(policy="sjf", max_wait_s=5.0)
    aged_max, _ = long_wait(policy="sjf", aging_rate=100.0)
    assert starved_max > 3 * bounded_max, (starved_max, bounded_max)
    assert starved_p99 > 3 * bounded_p99
    assert starved_max > 1.5 * aged_max
    fcfs_max, _ = long_wait(policy="fcfs")
    assert starved_max > 1.5 * fcfs_max  # SJF, not the load, is what starves them


def test_swap_pressure_swaps_and_recomputes():
    import loadprofiles.swap_pressure as sp

    p = resolve_profile("swap_pressure").with_duration_scale(0.34)
    for policy in ("fcfs", "sjf", "priority"):
        f = _simulate(p, policy, **sp.ENGINE_KNOBS).requests
        assert f["preempt_swaps"].sum() > 0, policy
        assert f["preempt_recomputes"].sum() > 0, policy
        assert f["recomputed_tokens"].sum() > 0
        assert f["status"].eq("ok").all()
    # With the default pool nothing is preempted: the knobs are what makes the pressure.
    assert _simulate(p, "fcfs").requests["preemptions"].sum() == 0


def test_replay_profile_reads_its_trace_from_the_environment(tmp_path, monkeypatch):
    sample = resolve_profile("replay")
    assert build_plan(sample).num_open_requests == 313
    path = write_csv(
        tmp_path / "mine.csv",
        ["Timestamp", "Request tokens", "Response tokens"],
        [(100.0, 50, 5), (101.0, 60, 6), (103.0, 70, 7)],
    )
    monkeypatch.setenv("SCHEDSCOPE_REPLAY_TRACE", str(path))
    monkeypatch.setenv("SCHEDSCOPE_REPLAY_TIME_SCALE", "2")
    p = resolve_profile("replay")
    specs = check_replay(p, [0, 1, 3], [50, 60, 70], [5, 6, 7], 2.0, cls=["chat"] * 3)
    assert specs[0].request_id == "replay-0-0000000"


def test_loading_every_profile_does_not_import_locust():
    code = (
        "import sys, json\n"
        "from harness.profiles import resolve_profile, shipped_profile_names\n"
        "for n in shipped_profile_names(): resolve_profile(n)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('locust', 'gevent', 'harness'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    modules = json.loads(out.stdout)
    # The profiles' `expose` hook (harness.loadgen.expose) is all of the load generator
    # they may import; the Locust user, the client and the dispatcher need gevent.
    loadgen = [m for m in modules if m.startswith("harness.loadgen")]
    assert set(loadgen) <= {"harness.loadgen", "harness.loadgen.expose"}, loadgen
    assert not [m for m in modules if m.startswith(("locust", "gevent"))]


def test_cli_duration_scale_and_default_alias(tmp_path):
    from harness.cli import app

    out = tmp_path / "o"
    result = CliRunner().invoke(
        app, ["simulate", "--profile", "default", "--duration-scale", "0.1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profile"] == "mixed"
    expected = build_plan(resolve_profile("mixed").with_duration_scale(0.1)).num_open_requests
    assert summary["policies"]["fcfs"]["overall"]["requests"] == expected
    import polars as pl

    assert pl.read_parquet(out / "requests.parquet").height == expected
    bad = CliRunner().invoke(app, ["simulate", "--duration-scale", "-1", "--out", str(out)])
    assert bad.exit_code != 0 and "duration" in bad.output


def test_bursty_ramp_arrivals_stay_in_order():
    """Regression (found by test_plan_invariants): gamma gaps near 0 made the ramp's
    inverse rate map round one ulp out of order."""
    phase = Phase(
        name="p0", duration_s=9.0, rate=1.5556099674237314, rate_end=4.0703125, burstiness=0.1
    )
    p = Profile(name="h", seed=0, classes=classes(0.5, 0.3, 0.2), phases=(phase,))
    t = [s.scheduled_at for s in build_plan(p).open_loop_requests()]
    assert t == sorted(t)
