"""--slo parsing (harness/tune/slo.py): targets, units, errors that name the part."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.profiles import resolve_profile
from harness.tune.slo import (
    METRICS,
    STATISTICS,
    SloError,
    Target,
    meets,
    parse_slo,
    parse_slos,
    profile_targets,
    request_slos,
)


def test_parse_two_targets_with_units():
    targets = parse_slo("short_chat:ttft_p95<=500ms, e2e_p99<=20s")
    assert targets == [
        Target("short_chat", "ttft", "p95", 0.5),
        Target("short_chat", "e2e", "p99", 20.0),
    ]
    assert targets[0].column == "ttft_s" and targets[0].name == "ttft_p95"


def test_a_bare_number_is_seconds():
    assert parse_slo("c:max_itl_max<=2")[0] == Target("c", "max_itl", "max", 2.0)
    assert parse_slo("c:max_itl_p95<=2")[0].column == "max_itl_s"
    assert parse_slo("c:total_queue_p99<=2")[0].column == "total_queue_s"


@given(
    st.sampled_from(sorted(METRICS)),
    st.sampled_from(STATISTICS),
    st.floats(min_value=1e-3, max_value=1e4, allow_nan=False),
)
def test_spec_parses_back_to_the_same_target(metric, stat, limit):
    target = Target("cls", metric, stat, float(f"{limit:g}"))
    assert parse_slo(f"cls:{target.spec()}") == [target]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("short_chat ttft_p95<=1s", "CLASS:TARGET"),
        (":ttft_p95<=1s", "class name"),
        ("c:", "empty target"),
        ("c:ttft_p95<=1s,", "empty target"),
        ("c:ttft_p95=1s", "METRIC_STAT<=LIMIT"),
        ("c:latency_p95<=1s", "unknown metric 'latency'"),
        # one name per metric: itl is every gap (the gate's); the longest is max_itl
        ("c:itl_p95<=1s", "'max_itl'"),
        ("c:ttft_p42<=1s", "unknown statistic 'p42'"),
        ("c:ttft_p95<=1min", "unknown unit 'min'"),
        ("c:ttft_p95<=0s", "positive"),
        ("c:ttft_p95<=1.2.3s", "not a number"),
        ("c:ttft_p95<=1s,ttft_p95<=2s", "ttft_p95 given twice"),
    ],
)
def test_errors_name_the_problem(text, names):
    with pytest.raises(SloError, match=names):
        parse_slo(text)


def test_classes_are_checked_against_the_profile():
    with pytest.raises(SloError, match="no class 'chat'.*short_chat, long_generation"):
        parse_slos(["chat:ttft_p95<=1s"], ["short_chat", "long_generation"])
    with pytest.raises(SloError, match="two --slo values"):
        parse_slos(["a:ttft_p95<=1s", "a:e2e_p99<=2s"], ["a"])


def test_without_slos_the_profile_slos_are_p95_targets():
    targets = profile_targets(resolve_profile("mixed"))
    assert Target("short_chat", "ttft", "p95", 1.0) in targets
    assert Target("long_generation", "e2e", "p95", 60.0) in targets


def _classes(p95: float, ok: int = 10, requests: int = 10) -> dict:
    return {
        "a": {
            "requests": requests,
            "counts": {"ok": ok},
            "metrics": {"ttft_s": {"p95": p95}},
        }
    }


def test_meets_needs_every_request_ok_and_every_target_within():
    targets = [Target("a", "ttft", "p95", 1.0)]
    assert meets(targets, _classes(0.9))
    assert not meets(targets, _classes(1.1))
    assert not meets(targets, _classes(0.5, ok=9))  # a rejected request missed
    assert not meets(targets, {})  # no requests of the class at all


def test_goodput_counts_against_the_slo_limits():
    slos = request_slos([Target("short_chat", "ttft", "p99", 0.25)], resolve_profile("mixed"))
    assert slos["short_chat"] == {"ttft_s": 0.25, "tpot_s": 0.1, "e2e_s": None}
    assert slos["long_generation"]["ttft_s"] == 5.0
