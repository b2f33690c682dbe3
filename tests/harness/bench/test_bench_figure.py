"""A figure beside its target: met, missed, no target, for lower- and higher-is-better."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.bench.figure import (
    MET,
    MISSED,
    NO_TARGET,
    NOT_MEASURED,
    Figure,
    FigureError,
    bound_text,
    meets,
    number_text,
    value_text,
)


@pytest.mark.parametrize(
    ("value", "target", "better", "verdict"),
    [
        (1.24, 1.3, "lower", MET),  # paging overhead under its bound
        (1.31, 1.3, "lower", MISSED),
        (1.3, 1.3, "lower", MET),  # equal is met
        (3.02, 3.0, "higher", MET),  # continuous/static ratio above its bound
        (2.99, 3.0, "higher", MISSED),
        (3.0, 3.0, "higher", MET),
        (0.0, 0.0, "higher", MET),
    ],
)
def test_the_verdict_follows_the_better_side(value, target, better, verdict):
    figure = Figure("f", value, "x", target, better)
    assert figure.verdict == verdict
    assert figure.met is (verdict == MET)


def test_without_a_target_or_a_value_there_is_no_verdict():
    assert Figure("f", 1.0).verdict == NO_TARGET and Figure("f", 1.0).met is None
    for missing in (None, math.nan):
        figure = Figure("f", missing, "s", 1.0)
        assert figure.verdict == NOT_MEASURED and figure.met is None


def test_an_infinite_value_is_not_measured():
    """An infinite ratio (bench_tune's winner / defaults when the defaults met no rate)
    measured nothing: it used to be "met" against any higher-is-better target."""
    for infinite in (math.inf, -math.inf):
        figure = Figure("f", infinite, "x", 1.0, "higher", 2.0)
        assert not figure.measured and figure.verdict == NOT_MEASURED
        assert figure.met is None and figure.aim_met is None
        assert value_text(figure) == "-"
        data = figure.to_dict()
        assert data["value"] is None and data["verdict"] == NOT_MEASURED  # JSON has no inf


def test_the_aim_is_judged_on_its_own():
    # bench_report: target <= 30 s, aim <= 10 s; bench_telemetry: >= 0.97, aim >= 0.99
    assert Figure("r", 12.0, "s", 30.0, "lower", 10.0).aim_met is False
    assert Figure("r", 9.0, "s", 30.0, "lower", 10.0).aim_met is True
    assert Figure("t", 0.98, "x", 0.97, "higher", 0.99).aim_met is False
    assert Figure("t", 0.995, "x", 0.97, "higher", 0.99).aim_met is True
    with pytest.raises(FigureError, match="aim without a target"):
        Figure("t", 1.0, aim=2.0)


@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6))
def test_lower_and_higher_agree_only_on_equality(value, bound):
    lower, higher = meets(value, bound, "lower"), meets(value, bound, "higher")
    assert lower or higher  # one side is always good
    assert (lower and higher) == (value == bound)


def test_a_bad_better_or_name_is_refused():
    with pytest.raises(FigureError, match="better"):
        Figure("f", 1.0, better="smaller")  # type: ignore[arg-type]
    with pytest.raises(FigureError, match="name"):
        Figure("", 1.0)


def test_a_figure_round_trips_through_its_dict():
    figure = Figure("p", 12.5, "ms", 30.0, "lower", 10.0, "at 1M requests")
    data = figure.to_dict()
    assert data["met"] is True and data["aim_met"] is False and data["verdict"] == MET
    assert Figure.from_dict(data) == figure
    assert Figure("n", math.nan).to_dict()["value"] is None  # JSON has no NaN
    with pytest.raises(FigureError):
        Figure.from_dict({"value": 1.0})


def test_values_and_bounds_read_as_the_benchmarks_print_them():
    assert number_text(0.01976) == "0.0198"
    assert number_text(1.2345) == "1.23"
    assert number_text(13.44) == "13.4"
    assert number_text(4779.2) == "4,779"
    assert value_text(Figure("f", 1.24, "x")) == "1.24x"
    assert value_text(Figure("f", 4779.0, "tokens/s")) == "4,779 tokens/s"
    assert value_text(Figure("f", None, "s")) == "-"
    assert bound_text(10_000, "higher", "tokens/s") == ">= 10,000 tokens/s"
    assert bound_text(1.3, "lower", "x") == "<= 1.3x"
    assert bound_text(None, "lower", "s") == ""
