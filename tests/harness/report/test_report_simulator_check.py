"""The simulator check's figures and ranking rule on hand-made frames, and the report's
section: rendered for a run with a simulated counterpart, absent for one without."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.report import ReportOptions, generate_report
from harness.report.cells import cell_identity
from harness.report.simulator_check import (
    SIMULATED_DIR,
    TIE_TOLERANCE,
    class_rows,
    compare,
    for_cells,
    ranking,
    relative_error,
)


def _frame(ttft: list[float], e2e: list[float] | None = None, classes=None, status=None):
    n = len(ttft)
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "class": classes or ["a"] * n,
            "status": status or ["ok"] * n,
            "scheduled_at": [float(i) for i in range(n)],
            "ttft_s": ttft,
            "e2e_s": e2e or [t * 10 for t in ttft],
        }
    )


latencies = st.lists(
    st.floats(min_value=1e-3, max_value=100, allow_nan=False), min_size=1, max_size=30
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["fcfs", "sjf", "priority"]), latencies, min_size=1),
    st.lists(st.sampled_from(["short", "long"]), min_size=30, max_size=30),
)
def test_identical_served_and_simulated_frames_have_no_error_and_the_same_ranking(
    per_policy, class_pool
):
    frames = {p: _frame(v, classes=class_pool[: len(v)]) for p, v in per_policy.items()}
    check = compare(frames, {p: f.clone() for p, f in frames.items()}, {})
    for cell in check["cells"].values():
        for row in cell["classes"].values():
            assert row["requests"] == row["simulated_requests"]
            for key in ("ttft_s_p50", "ttft_s_p95", "e2e_s_p50", "e2e_s_p95"):
                assert row[key]["rel_error"] == 0
    for classes in check["rankings"].values():
        for by in classes.values():
            for r in by.values():
                assert r["served_order"] == r["simulated_order"]
                assert r["matches"] is not False and not r["reversed_pairs"]
                # a match needs a pair both sides order; all ties is undetermined
                assert r["matches"] is (True if r["pairs_compared"] else None)


def test_figures_per_class_over_ok_requests_only():
    served = _frame(
        [0.1, 0.2, 0.3, 9.0], classes=["a", "a", "b", "b"], status=["ok", "ok", "ok", "error"]
    )
    simulated = _frame([0.2, 0.2, 0.15, 0.15], classes=["a", "a", "b", "b"])
    rows = class_rows(served, simulated)
    assert set(rows) == {"all", "a", "b"}
    # b: served only the ok 0.3 (the 9 s error is left out); simulated 0.15 -> -50%
    assert rows["b"]["requests"] == 1 and rows["b"]["simulated_requests"] == 2
    assert rows["b"]["ttft_s_p50"]["served"] == pytest.approx(0.3)
    assert rows["b"]["ttft_s_p50"]["rel_error"] == pytest.approx(-0.5)
    # a: p50 of [0.1, 0.2] = 0.15 served, 0.2 simulated -> +33%
    assert rows["a"]["ttft_s_p50"]["rel_error"] == pytest.approx(0.2 / 0.15 - 1)
    assert relative_error(0.0, 1.0) is None and relative_error(None, 1.0) is None


def test_ranking_reversed_matched_and_tied():
    # served: fcfs 1.0 < sjf 2.0; simulated: sjf 1.0 < fcfs 2.0 -> reversed
    reversed_ = ranking({"fcfs": (1.0, 2.0), "sjf": (2.0, 1.0)})
    assert reversed_["matches"] is False and reversed_["reversed_pairs"] == [["fcfs", "sjf"]]
    assert reversed_["served"] == "fcfs < sjf" and reversed_["simulated"] == "sjf < fcfs"
    # the same order on both sides, at another scale -> matches
    assert ranking({"fcfs": (1.0, 10.0), "sjf": (2.0, 30.0)})["matches"] is True
    # served within the tie tolerance: the only pair is not compared, so nothing matches
    close = 1.0 + TIE_TOLERANCE / 2
    tied = ranking({"fcfs": (close, 2.0), "sjf": (1.0, 1.0)})
    assert tied["matches"] is None and tied["served"] == "sjf ≈ fcfs"
    assert tied["pairs_compared"] == 0 and "served side ties every pair" in tied["undetermined"]
    # just beyond the tolerance it is an order, and here a reversed one
    apart = 1.0 / (1 - TIE_TOLERANCE) * 1.01
    assert ranking({"fcfs": (close, 1.0), "sjf": (1.0, 2.0)})["matches"] is None
    assert ranking({"fcfs": (apart, 1.0), "sjf": (1.0, 2.0)})["matches"] is False
    # one policy (or unknown values): nothing to rank
    assert ranking({"fcfs": (1.0, 2.0), "sjf": (None, 1.0)})["matches"] is None


def test_rankings_stay_within_a_group_of_cells():
    frames = {
        "fcfs-x0.5": _frame([1.0]),
        "sjf-x0.5": _frame([2.0]),
        "fcfs-x2": _frame([5.0]),
        "sjf-x2": _frame([9.0]),
    }
    simulated = {
        "fcfs-x0.5": _frame([1.0]),
        "sjf-x0.5": _frame([2.0]),
        "fcfs-x2": _frame([9.0]),
        "sjf-x2": _frame([5.0]),
    }
    # each cell's policy as its run.json records it (harness/report/cells.py)
    identities = {n: cell_identity(n, {"policy": n.split("-")[0]}, None) for n in frames}
    rankings = compare(frames, simulated, {}, identities=identities)["rankings"]
    assert set(rankings) == {"-x0.5", "-x2"}
    assert rankings["-x0.5"]["a"]["ttft_s_p95"]["matches"] is True
    assert rankings["-x2"]["a"]["ttft_s_p95"]["matches"] is False


def _run_dir(tmp_path, with_simulated: bool, simulated_ttft: pl.Expr | None = None):
    root = tmp_path / "run"
    for policy, ttft in (("fcfs", [0.1, 0.2, 0.4, 0.8]), ("sjf", [0.1, 0.1, 0.2, 0.3])):
        cell = root / policy
        cell.mkdir(parents=True)
        frame = _frame(ttft, classes=["short", "short", "long", "long"]).with_columns(
            pl.lit(policy).alias("policy")
        )
        frame.write_parquet(cell / "requests.parquet")
        if with_simulated:
            (cell / SIMULATED_DIR).mkdir()
            changed = pl.col("ttft_s") * 1.5 if simulated_ttft is None else simulated_ttft
            frame.with_columns(changed).write_parquet(cell / SIMULATED_DIR / "requests.parquet")
            entry = {"model": "/store/cost-model-abc.json", "fitted_at": "2026-01-01T00:00:00"}
            (cell / "run.json").write_text(
                json.dumps({"simulator_check": {**entry, "predates_run": True}})
            )
    return root


def test_report_section_rendered_only_with_the_simulated_counterpart(tmp_path):
    options = ReportOptions(figures=False, resamples=20)
    old = generate_report([_run_dir(tmp_path / "old", False)], tmp_path / "old-out", options)
    assert "Simulator vs this run" not in old["markdown"].read_text()
    assert "simulator-check" not in old["html"].read_text()
    assert "simulator_check" not in json.loads(old["summary"].read_text())
    assert for_cells({}) is None

    paths = generate_report([_run_dir(tmp_path / "new", True)], tmp_path / "new-out", options)
    md = paths["markdown"].read_text()
    assert "## Simulator vs this run" in md
    for policy in ("fcfs", "sjf"):
        for cls in ("all", "short", "long"):
            assert f"| run | {policy} | {cls} | " in md
    assert "/store/cost-model-abc.json (fitted 2026-01-01T00:00:00)" in md
    assert "out of sample" in md
    # simulated TTFT is the served one x 1.5 everywhere: +50%, and the same ranking
    assert "+50%" in md and "ranking matches" in md and "ranking differs" not in md
    assert 'id="simulator-check"' in paths["html"].read_text()
    summary = json.loads(paths["summary"].read_text())
    check = summary["simulator_check"]
    assert check["cells"]["fcfs"]["classes"]["long"]["ttft_s_p95"]["rel_error"] == pytest.approx(
        0.5
    )
    assert check["cells"]["sjf"]["model"]["model"] == "/store/cost-model-abc.json"
    # the simulated records are not a policy of their own
    assert set(summary["policies"]) == {"fcfs", "sjf"}


def test_a_cell_reported_alone_keeps_its_simulated_records_out_of_the_policies(tmp_path):
    cell = _run_dir(tmp_path, True) / "fcfs"
    paths = generate_report([cell], tmp_path / "out", ReportOptions(figures=False, resamples=20))
    summary = json.loads(paths["summary"].read_text())
    assert set(summary["policies"]) == {"fcfs"}
    assert set(summary["simulator_check"]["cells"]) == {"fcfs"}


def _band(ttft_ends: dict[str, tuple[float, float]]) -> dict:
    """A counterpart's speed band whose TTFT p50 per class has the given (fastest,
    slowest) ends; the other figures' ends are left out."""
    return {
        "time_ratios": {"fastest": 0.9, "slowest": 1.2},
        "sources": 3,
        "policies": {
            "cell": {
                cls: {"ttft_s": {"p50": {"fastest": lo, "slowest": hi}}}
                for cls, (lo, hi) in ttft_ends.items()
            }
        },
    }


def test_each_figure_says_whether_the_served_value_lies_in_the_speed_band():
    served = _frame([0.1, 0.2, 0.3, 0.5], classes=["a", "a", "b", "b"])
    band = _band({"a": (0.1, 0.2), "b": (0.2, 0.3)})  # served p50: a 0.15, b 0.4
    cell = compare({"x": served}, {"x": served.clone()}, {}, {"x": band})["cells"]["x"]
    assert cell["speed_band"] == {"time_ratios": {"fastest": 0.9, "slowest": 1.2}, "sources": 3}
    assert cell["classes"]["a"]["ttft_s_p50"]["in_band"] is True
    assert cell["classes"]["b"]["ttft_s_p50"]["in_band"] is False
    assert cell["classes"]["b"]["ttft_s_p50"]["band"] == {"fastest": 0.2, "slowest": 0.3}
    # a figure the band does not cover says nothing about it
    assert "in_band" not in cell["classes"]["a"]["e2e_s_p95"]
    assert "in_band" not in cell["classes"]["all"]["ttft_s_p50"]


def test_the_report_counts_the_served_figures_inside_the_speed_band(tmp_path):
    root = _run_dir(tmp_path, True)
    # fcfs served TTFT p50: short 0.15, long 0.6; the band holds the first only
    summary = {"speed_band": _band({"short": (0.1, 0.2), "long": (0.3, 0.5)})}
    (root / "fcfs" / SIMULATED_DIR / "summary.json").write_text(json.dumps(summary))
    paths = generate_report([root], tmp_path / "out", ReportOptions(figures=False, resamples=20))
    md = paths["markdown"].read_text()
    assert (
        "run/fcfs: at the speeds this machine's steps ran at across the model's 3 sources "
        "(0.90-1.20x its price), the simulated band holds 1 of 2 served figures; outside "
        "it: 'long' TTFT p50 600 ms (band 300 ms-500 ms)"
    ) in md
    assert "run/sjf: at the speeds" not in md  # no band for that cell


def test_a_band_that_covers_no_served_figure_says_nothing():
    from harness.report.render import speed_band_text

    served = _frame([0.1, 0.2], classes=["a", "a"])
    band = _band({"zz": (0.1, 0.2)})  # a class the run does not have
    cell = compare({"x": served}, {"x": served.clone()}, {}, {"x": band})["cells"]["x"]
    assert speed_band_text(cell["speed_band"], cell["classes"]) is None


def test_a_simulator_four_times_off_whose_values_all_tie_matches_no_ranking():
    # the served run orders three policies clearly; the simulator is 4x low on each
    # and puts them within 10% of one another: no pair is compared, nothing matches
    served = {"fcfs": 40.0, "sjf": 48.0, "priority": 60.0}
    simulated = {"fcfs": 10.0, "sjf": 10.5, "priority": 10.2}
    r = ranking({p: (served[p], simulated[p]) for p in served})
    assert r["matches"] is None and r["pairs_compared"] == 0 and not r["reversed_pairs"]
    assert r["undetermined"] == "the simulated side ties every pair (within 10%)"
    # the same served order with a simulator that orders them: now it is a check
    ordered = ranking({p: (served[p], served[p] / 4) for p in served})
    assert ordered["matches"] is True and ordered["pairs_compared"] == 3


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["fcfs", "sjf", "priority"]),
        st.tuples(
            st.floats(min_value=1e-3, max_value=100, allow_nan=False),
            st.floats(min_value=1.0, max_value=1.0 + TIE_TOLERANCE / 3, allow_nan=False),
        ),
        min_size=1,
    )
)
def test_a_side_that_ties_every_pair_never_makes_a_match(values):
    # the simulated values all lie within the tolerance of each other
    r = ranking(values)
    assert r["matches"] is None and r["pairs_compared"] == 0 and r["undetermined"]


def test_report_says_undetermined_when_the_simulated_side_ties_every_pair(tmp_path):
    # every simulated TTFT the same 5 s: off by far, and no order between the policies
    run = _run_dir(tmp_path / "run", True, simulated_ttft=pl.lit(5.0).alias("ttft_s"))
    options = ReportOptions(figures=False, resamples=20)
    md = generate_report([run], tmp_path / "out", options)["markdown"].read_text()
    assert "ranking undetermined: the simulated side ties every pair (within 10%)" in md
    ttft_lines = [line for line in md.splitlines() if "by TTFT p95" in line]
    assert len(ttft_lines) == 3  # all, long, short
    assert not [line for line in ttft_lines if "ranking matches" in line]


def test_the_printed_rule_is_the_rule_the_check_applies(tmp_path):
    """The section's rule text used to say a pair 'matches' when no pair is reversed and
    that a tie 'agrees with any order': the rule before undetermined rankings. It now
    says what :func:`ranking` does (the module docstring's rule)."""
    from harness.report.render import SIMULATOR_RULE

    rule = SIMULATOR_RULE.format(tol=TIE_TOLERANCE)
    assert "agree with any order" not in rule
    assert "compared when both sides order it" in rule
    assert "matches when at least one pair is compared and none is reversed" in rule
    assert "undetermined when no pair is compared" in rule
    paths = generate_report(
        [_run_dir(tmp_path / "run", True)], tmp_path / "out", ReportOptions(figures=False)
    )
    assert rule in paths["markdown"].read_text()


def test_a_policy_with_a_value_on_one_side_only_leaves_the_ranking_undetermined(tmp_path):
    """The review's case: the simulation has no ok 'long' request under priority while
    the served run had some; the ranking used to drop priority and 'match' over fcfs and
    sjf, with no word about it."""
    r = ranking({"fcfs": (1.0, 2.0), "sjf": (3.0, 6.0), "priority": (5.0, None)})
    assert r["matches"] is None and r["missing"] == ["priority"]
    assert r["undetermined"] == "priority has no simulated value (no ok request)"
    both = ranking({"fcfs": (1.0, 2.0), "sjf": (3.0, 6.0), "priority": (None, 4.0)})
    assert both["matches"] is None and "priority has no served value" in both["undetermined"]
    # a policy with no value on either side is left out and named; the rest still rank
    none = ranking({"fcfs": (1.0, 2.0), "sjf": (3.0, 6.0), "priority": (None, None)})
    assert none["matches"] is True and none["missing"] == ["priority"]
    assert ranking({"fcfs": (1.0, 2.0), "sjf": (3.0, 6.0)})["missing"] == []

    # the report says so: priority's simulated 'long' requests all failed
    root = _run_dir(tmp_path / "run", True)
    cell = root / "priority"
    (cell / SIMULATED_DIR).mkdir(parents=True)
    served = _frame([0.2, 0.2, 0.6, 0.9], classes=["short", "short", "long", "long"])
    served.with_columns(pl.lit("priority").alias("policy")).write_parquet(cell / "requests.parquet")
    served.with_columns(
        pl.lit("priority").alias("policy"),
        pl.when(pl.col("class") == "long")
        .then(pl.lit("error"))
        .otherwise(pl.col("status"))
        .alias("status"),
    ).write_parquet(cell / SIMULATED_DIR / "requests.parquet")
    options = ReportOptions(figures=False, resamples=20)
    md = generate_report([root], tmp_path / "out", options)["markdown"].read_text()
    (line,) = [x for x in md.splitlines() if "'long' by TTFT p95" in x]
    assert "ranking matches" not in line
    assert "ranking undetermined: priority has no simulated value (no ok request)" in line


def test_the_report_names_what_the_cell_s_refit_left_out(tmp_path):
    """A cell's refit of this machine's cost model (run.json ``cost_fit``) that left out a
    source off the pool's speed and the steps of its lagging load generator: the
    section says both; a cell whose refit left out nothing says nothing of it."""
    root = _run_dir(tmp_path, True)
    info = json.loads((root / "fcfs" / "run.json").read_text())
    info["cost_fit"] = {
        "stored": "/store/cost-model-abc.json",
        "sources_left_out": [
            {
                "name": "runs/x/sjf",
                "kind": "run",
                "steps": 2100,
                "time_ratio": 1.52,
                "median_time_ratio": 0.98,
            }
        ],
        "off_speed_sources_kept": [],
        "generator_limited_steps_left_out": 1234,
    }
    (root / "fcfs" / "run.json").write_text(json.dumps(info))
    paths = generate_report([root], tmp_path / "out", ReportOptions(figures=False, resamples=20))
    md = " ".join(paths["markdown"].read_text().split())
    assert (
        "run/fcfs: its refit of this machine's cost model left out the sources whose steps "
        "ran off the pool's speed (--keep-off-speed-sources keeps them): run runs/x/sjf "
        "(its steps took 1.52x the price, the sources' median 0.98x); 1,234 of its step "
        "cycles were not fitted: they started while the load generator lagged its schedule"
    ) in md, md
    assert "run/sjf: its refit" not in md
    summary = json.loads(paths["summary"].read_text())
    fcfs = summary["simulator_check"]["cells"]["fcfs"]
    assert fcfs["cost_fit"]["generator_limited_steps_left_out"] == 1234
    assert "cost_fit" not in summary["simulator_check"]["cells"]["sjf"]


def test_requests_read_at_once_are_counted_and_said():
    """Requests whose tokens reached the client in one go (most gaps microseconds against
    millisecond steps: harness/records/stream_reads.py) are counted per cell; a frame
    without token gaps says nothing (None), a run with none read at once says 0."""
    from harness.report.simulator_check import read_at_once_count

    steps = [0.01, 0.012, 0.011, 0.009, 0.01]
    reads = [1e-5, 2e-5, 1e-5, 1e-5, 3e-5]
    frame = _frame([0.1, 0.2, 0.3, 0.4]).with_columns(
        pl.Series("itl_s", [steps, reads, steps, [1e-5, 1e-5]])  # the last: too few gaps
    )
    assert read_at_once_count(frame) == {"requests": 1, "of": 4}
    failed = frame.with_columns(pl.Series("status", ["ok", "error", "ok", "ok"]))
    assert read_at_once_count(failed) == {"requests": 0, "of": 3}
    assert read_at_once_count(_frame([0.1])) is None
    check = compare({"fcfs": frame}, {"fcfs": _frame([0.1, 0.2, 0.3, 0.4])}, {})
    assert check["cells"]["fcfs"]["read_at_once"] == {"requests": 1, "of": 4}


def test_the_report_says_how_many_requests_the_client_read_at_once(tmp_path):
    root = _run_dir(tmp_path, True)
    cell = root / "fcfs" / "requests.parquet"
    steps, reads = [0.01, 0.012, 0.011, 0.009], [1e-5, 2e-5, 1e-5, 1e-5]
    pl.read_parquet(cell).with_columns(
        pl.Series("itl_s", [steps, reads, reads, steps])
    ).write_parquet(cell)
    paths = generate_report([root], tmp_path / "out", ReportOptions(figures=False, resamples=20))
    md = " ".join(paths["markdown"].read_text().split())
    assert "run/fcfs: 2 of 4 served requests reached the client in one go" in md, md
    assert md.count("reached the client in one go") == 1  # sjf's cell has no gaps: silent
    summary = json.loads(paths["summary"].read_text())["simulator_check"]["cells"]
    assert summary["fcfs"]["read_at_once"] == {"requests": 2, "of": 4}
    assert summary["sjf"]["read_at_once"] is None


def _priced(ratio: float, **model) -> dict:
    model_s = 100.0
    return {
        **model,
        "steps_priced": {
            "steps": 1000,
            "served_s": ratio * model_s,
            "model_s": model_s,
            "ratio": ratio,
        },
    }


@pytest.mark.parametrize("ratio", [0.77, 0.89, 1.11, 1.6])
def test_a_model_whose_prices_miss_the_run_s_steps_is_named_stale_with_its_fix(ratio):
    from harness.report.render import priced_steps_text

    text = priced_steps_text(_priced(ratio, model="/store/cost-model-abc.json"))
    assert f"served/model {ratio:.2f}" in text
    assert "not of this machine as it ran" in text
    assert "`schedscope calibrate --quick` fits it again" in text
    assert ("faster" if ratio < 1 else "slower") in text


@pytest.mark.parametrize("ratio", [0.9, 1.0, 1.1])
def test_a_model_that_prices_the_run_s_steps_within_ten_percent_is_not_called_stale(ratio):
    from harness.report.render import priced_steps_text

    text = priced_steps_text(_priced(ratio, model="/store/cost-model-abc.json"))
    assert f"served/model {ratio:.2f}" in text and "calibrate" not in text


def test_the_fix_named_follows_the_model_and_no_priced_steps_say_nothing():
    from harness.report.render import priced_steps_text

    assert "`schedscope calibrate --quick` fits this machine" in priced_steps_text(
        _priced(1.8, model="builtin")
    )
    target = priced_steps_text(_priced(0.7, model="/s/t.json", target="vllm-0.32.0-x"))
    assert "`schedscope calibrate --from-run` of a run like this one" in target
    assert priced_steps_text({"model": "builtin"}) is None
    assert priced_steps_text({"steps_priced": {"steps": 0, "ratio": None}}) is None
