"""The gate on real (served) runs: per-request rows, the paired block bootstrap, a
regression fails only when its interval clears the tolerance; repeats pool; a
generator-limited run, a missing cell or class, summary-only inputs for a relative rule
and a baseline of another seed are usage errors (exit 2) that name the problem."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from harness.cli import app
from harness.gate.config import parse_config
from harness.gate.gate import run_gate
from harness.gate.sides import GateInputError
from tests.support.gate_runs import requests_frame, write_run

runner = CliRunner()
TTFT_P95 = {"rule": [{"name": "ttft", "class": "*", "metric": "ttft", "max_regression": 0.05}]}


def gate(tmp_path, base, current, *extra, config=None):
    args = ["gate", "--baseline", str(base), "--current", str(current), *extra]
    if config is not None:
        path = tmp_path / "gate.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    return runner.invoke(app, args)


def test_identical_noise_makes_the_interval_a_point(tmp_path):
    """The pairing is by schedule window: the same draws scaled by 1.08 give +8% in every
    resample, so the interval is the point +8% and clears a 5% tolerance."""
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1)})
    scaled = write_run(tmp_path / "b", {"fcfs": requests_frame(seed=1, scale=1.08)})
    for check in run_gate(base, scaled, parse_config(TTFT_P95)).checks:
        assert check.interval == pytest.approx((0.08, 0.08), abs=1e-9)
        assert not check.passed


def test_one_request_a_side_is_too_few_for_an_interval(tmp_path):
    """Two requests, one of each class: every resample repeats the same values, so the
    interval was the point +50%, 'clearing' the tolerance whatever the noise; now no
    interval is drawn from fewer than MIN_SHARED_BLOCKS windows, and the line says so."""
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1, n=2)})
    slower = write_run(tmp_path / "b", {"fcfs": requests_frame(seed=1, n=2, scale=1.5)})
    result = run_gate(base, slower, parse_config(TTFT_P95))
    assert result.checks and all(c.interval is None and not c.passed for c in result.checks)
    assert all("too few requests for an interval" in c.message for c in result.checks)


def test_same_engine_other_noise_passes_and_a_planted_regression_fails(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1)})
    same = write_run(tmp_path / "b", {"fcfs": requests_frame(seed=2)})
    slower = write_run(tmp_path / "c", {"fcfs": requests_frame(seed=2, scale=1.5)})
    config = parse_config(TTFT_P95)
    passed = run_gate(base, same, config)
    assert passed.exit_code == 0
    assert all(c.method == "bootstrap" for c in passed.checks)
    failed = run_gate(base, slower, config)
    assert failed.exit_code == 1
    for check in failed.checks:
        assert not check.passed
        assert check.interval[0] > 0.05  # the whole interval is past the tolerance
        assert check.interval[0] <= check.change <= check.interval[1]


def test_a_regression_within_the_noise_is_not_called(tmp_path):
    """+8% on 200 requests per class with their own noise: the interval of the p95
    reaches below the 5% tolerance, so the gate does not call it."""
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1)})
    slightly = write_run(tmp_path / "b", {"fcfs": requests_frame(seed=2, scale=1.08)})
    result = run_gate(base, slightly, parse_config(TTFT_P95))
    assert result.exit_code == 0
    for check in result.checks:
        assert check.interval[0] <= 0.05 < check.interval[1]
        assert "within noise" in check.message


@settings(max_examples=15, deadline=None)
@given(scale=st.floats(0.7, 1.6), tolerance=st.floats(0.0, 0.3), seed=st.integers(1, 50))
def test_a_line_fails_exactly_when_its_interval_clears_the_tolerance(
    tmp_path_factory, scale, tolerance, seed
):
    root = tmp_path_factory.mktemp("runs")
    base = write_run(root / "a", {"fcfs": requests_frame(seed=seed, n=120)})
    cur = write_run(root / "b", {"fcfs": requests_frame(seed=seed + 1, n=120, scale=scale)})
    config = parse_config(
        {"gate": {"resamples": 200}, "rule": [{"metric": "e2e", "max_regression": tolerance}]}
    )
    (check,) = run_gate(base, cur, config).checks
    assert check.passed == (check.interval[0] <= tolerance)
    assert check.interval[0] <= check.interval[1]


def test_goodput_is_higher_is_better_and_error_rate_an_absolute_ceiling(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1)})
    failing = write_run(tmp_path / "b", {"fcfs": requests_frame(seed=1, errors=40, scale=2.0)})
    config = parse_config(
        {
            "rule": [
                {"name": "good", "metric": "goodput", "max_regression": 0.05},
                {"name": "errors", "metric": "error_rate", "max": 0.05},
            ]
        }
    )
    good, errors = run_gate(base, failing, config).checks
    assert good.current < good.baseline and good.change > 0.05 and not good.passed
    assert errors.current == pytest.approx(0.1) and errors.kind == "ceiling" and not errors.passed
    assert "0.1 > ceiling 0.05" in errors.message


def test_repeats_are_pooled(tmp_path):
    cells = {f"fcfs-r{k}": requests_frame(seed=k) for k in (1, 2, 3)}
    base = write_run(tmp_path / "a", cells)
    cur = write_run(tmp_path / "b", {f"fcfs-r{k}": requests_frame(seed=k + 10) for k in (1, 2, 3)})
    result = run_gate(base, cur, parse_config(TTFT_P95))
    assert {c.cell for c in result.checks} == {"fcfs"}
    assert result.baseline.cells["fcfs"].repeats == 3
    assert result.baseline.cells["fcfs"].frame.height == 1200
    assert any("repeats pooled: fcfs x3" in n for n in result.notes)


def test_the_cli_writes_markdown_junit_json_and_the_step_summary(tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = write_run(
        tmp_path / "a", {"fcfs": requests_frame(seed=1), "sjf": requests_frame(seed=3)}
    )
    cur = write_run(
        tmp_path / "b", {"fcfs": requests_frame(seed=2, scale=1.4), "sjf": requests_frame(seed=4)}
    )
    result = gate(
        tmp_path,
        base,
        cur,
        "--junit",
        str(tmp_path / "j.xml"),
        "--json",
        str(tmp_path / "g.json"),
        config='[[rule]]\nname = "ttft"\nclass = "*"\nmetric = "ttft"\nmax_regression = 0.05\n',
    )
    assert result.exit_code == 1, result.output
    assert "gate: FAIL (2 of 4 checks failed)" in result.output
    assert "FAIL ttft: fcfs/short_chat ttft p95: baseline" in result.output
    assert "| ❌ | ttft | fcfs | short_chat | ttft p95 |" in summary.read_text()
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("4", "2")
    failures = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert {c.get("classname") for c in failures} == {"gate.fcfs"}
    body = json.loads((tmp_path / "g.json").read_text())
    assert body["result"] == "fail" and body["exit_code"] == 1
    assert sum(not c["passed"] for c in body["checks"]) == 2
    assert body["sides"]["baseline"]["mode"] == "serve"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("missing_cell", "cell 'sjf' is missing from the current"),
        ("missing_class", "class 'long_generation' is missing from cell fcfs of the current"),
        ("generator_limited", "the current cell fcfs is generator-limited (p99 send lag 200.0 ms)"),
        ("seed", "different seed (baseline 1, current 2)"),
        ("profile", "different profile"),
        ("schedule", "different schedule"),
        ("simulated", "the baseline is real and the current run simulated"),
    ],
)
def test_usage_errors_exit_2_and_name_the_problem(tmp_path, change, named):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1), "sjf": requests_frame(2)})
    frame = requests_frame(3)
    cells = {"fcfs": frame, "sjf": requests_frame(4)}
    options: dict = {}
    if change == "missing_cell":
        del cells["sjf"]
    elif change == "missing_class":
        cells["fcfs"] = frame.filter(pl.col("class") == "short_chat")
    elif change == "generator_limited":
        options["generator_limited"] = True
    elif change == "seed":
        options["seed"] = 2
    elif change == "profile":
        options["profile"] = "starvation"
    elif change == "schedule":
        cells["fcfs"] = frame.with_columns(pl.col("schedule_offset_s") + 1)
    elif change == "simulated":
        options["mode"] = "simulate"
    cur = write_run(tmp_path / "b", cells, **options)
    # Dropping a class changes the schedule too: allow that to reach the class check.
    extra = ["--allow-mismatch", "schedule"] if change == "missing_class" else []
    result = gate(
        tmp_path,
        base,
        cur,
        *extra,
        config='[[rule]]\nclass = "*"\nmetric = "ttft"\nmax_regression = 0.1\n',
    )
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())


def test_allow_mismatch_compares_deliberately(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    cur = write_run(tmp_path / "b", {"fcfs": requests_frame(2)}, seed=9)
    result = gate(tmp_path, base, cur, "--allow-mismatch", "seed")
    assert result.exit_code == 0, result.output
    assert "allowed mismatch: seed" in result.output
    assert gate(tmp_path, base, cur, "--allow-mismatch", "colour").exit_code == 2


def _with_machine(run, key: str):
    """``run`` as recorded on the machine whose fingerprint key is ``key``."""
    info = json.loads((run / "run.json").read_text())
    info["machine"] = {"machine_key": key}
    (run / "run.json").write_text(json.dumps(info))
    return run


@pytest.mark.parametrize("key", ["seed", "profile"])
def test_a_required_key_unknown_on_both_sides_is_a_mismatch(tmp_path, key):
    """docs/gate.md: profile, seed and schedule must be known on both sides. Two runs
    that both say nothing of their seed (or profile) used to be accepted as one."""
    unknown = {key: None}
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1)}, **unknown)
    cur = write_run(tmp_path / "b", {"fcfs": requests_frame(2)}, **unknown)
    with pytest.raises(GateInputError, match=f"{key} is not known on both sides"):
        run_gate(base, cur, parse_config(TTFT_P95))
    known = write_run(tmp_path / "c", {"fcfs": requests_frame(2)})  # seed 1, profile mixed
    with pytest.raises(GateInputError, match=f"{key} is not known on both sides"):
        run_gate(base, known, parse_config(TTFT_P95))
    allowed = gate(tmp_path, base, cur, "--allow-mismatch", key)
    assert allowed.exit_code == 0, allowed.output
    assert f"allowed mismatch: {key} (baseline None, current None" in allowed.output


def test_a_schedule_unknown_on_both_sides_is_a_mismatch(tmp_path):
    """Two baseline files whose cells record no schedule digest: nothing says they are
    one schedule (a summary.json holds none at all, and is not asked for one)."""
    base_run = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    baseline = tmp_path / "baseline.json"
    made = runner.invoke(
        app, ["baseline", "update", "--from", str(base_run), "--out", str(baseline)]
    )
    assert made.exit_code == 0, made.output
    body = json.loads(baseline.read_text())
    body["cells"]["fcfs"]["schedule"] = None
    baseline.write_text(json.dumps(body))
    with pytest.raises(GateInputError, match="schedule is not known on both sides"):
        run_gate(baseline, baseline, parse_config(TTFT_P95))
    allowed = run_gate(baseline, baseline, parse_config(TTFT_P95), {"schedule"})
    assert allowed.exit_code == 0
    assert any(n.startswith("allowed mismatch: schedule (cell fcfs") for n in allowed.notes)


def test_a_real_run_s_machine_unknown_on_one_side_is_a_mismatch(tmp_path):
    """A baseline file whose identity.machine is null, against a run recorded on a
    machine: nothing says they ran on one machine. It used to raise no mismatch."""
    base_run = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    baseline = tmp_path / "baseline.json"
    made = runner.invoke(
        app, ["baseline", "update", "--from", str(base_run), "--out", str(baseline)]
    )
    assert made.exit_code == 0 and json.loads(baseline.read_text())["identity"]["machine"] is None
    cur = _with_machine(write_run(tmp_path / "b", {"fcfs": requests_frame(2)}), "epyc-1")
    with pytest.raises(GateInputError, match="machine is not known on both sides"):
        run_gate(baseline, cur, parse_config(TTFT_P95))
    with pytest.raises(GateInputError, match="machine is not known on both sides"):
        run_gate(cur, baseline, parse_config(TTFT_P95))
    allowed = gate(tmp_path, baseline, cur, "--allow-mismatch", "machine")
    assert allowed.exit_code == 0, allowed.output
    assert "allowed mismatch: machine (baseline None, current 'epyc-1'" in allowed.output
    # unknown on both sides: nothing to compare, as before
    assert run_gate(baseline, base_run, parse_config(TTFT_P95)).exit_code == 0


def test_a_simulated_run_s_machine_unknown_on_one_side_is_a_note(tmp_path):
    """A simulated run's machine is the one its cost model was fitted on; the built-in
    model has none. Known on one side only, the gate says so and compares."""
    frame = requests_frame(1)
    base = write_run(tmp_path / "a", {"fcfs": frame}, mode="simulate", durations={"fcfs": 60.0})
    cur = write_run(tmp_path / "b", {"fcfs": frame}, mode="simulate", durations={"fcfs": 60.0})
    summary = json.loads((cur / "summary.json").read_text())
    summary["cost_model"] = {"fingerprint": {"machine_key": "epyc-1"}}
    (cur / "summary.json").write_text(json.dumps(summary))
    result = run_gate(base, cur, parse_config(TTFT_P95))
    assert result.exit_code == 0
    assert result.current.identity["machine"] == "epyc-1"
    assert any(
        n.startswith("machine known on one side only (baseline None, current 'epyc-1')")
        for n in result.notes
    ), result.notes


def test_summary_json_cannot_carry_a_relative_rule_between_real_runs(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    summary = tmp_path / "summary.json"
    summary.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "mode": "serve",
                "profile": "mixed",
                "seed": 1,
                "policies": {
                    "fcfs": {"overall": {"metrics": {"ttft_s": {"p95": 1.0}}}, "classes": {}}
                },
            }
        )
    )
    with pytest.raises(GateInputError, match="needs per-request data"):
        run_gate(base, summary, parse_config({"rule": [{"metric": "ttft", "max_regression": 0.1}]}))
    absolute = parse_config({"rule": [{"metric": "ttft", "max": 0.5}]})
    (check,) = run_gate(base, summary, absolute).checks
    assert (check.current, check.passed) == (1.0, False)


def test_baseline_files_round_trip_and_guard_their_identity(tmp_path):
    base_run = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    baseline = tmp_path / "ci" / "baseline.json"
    made = runner.invoke(
        app, ["baseline", "update", "--from", str(base_run), "--out", str(baseline)]
    )
    assert made.exit_code == 0, made.output
    body = json.loads(baseline.read_text())
    assert body["kind"] == "schedscope-baseline" and body["identity"]["seed"] == 1
    from_file = run_gate(
        baseline, write_run(tmp_path / "b", {"fcfs": requests_frame(2)}), parse_config(TTFT_P95)
    )
    from_dir = run_gate(base_run, tmp_path / "b", parse_config(TTFT_P95))
    assert [(c.baseline, c.interval) for c in from_file.checks] == [
        (c.baseline, c.interval) for c in from_dir.checks
    ]
    other = write_run(tmp_path / "c", {"fcfs": requests_frame(1)}, seed=5)
    refused = runner.invoke(
        app, ["baseline", "update", "--from", str(other), "--out", str(baseline)]
    )
    assert refused.exit_code == 2 and "different seed" in " ".join(refused.output.split())
    forced = runner.invoke(
        app,
        [
            "baseline",
            "update",
            "--from",
            str(other),
            "--out",
            str(baseline),
            "--allow-mismatch",
            "seed",
        ],
    )
    assert forced.exit_code == 0 and json.loads(baseline.read_text())["identity"]["seed"] == 5
    limited = write_run(tmp_path / "d", {"fcfs": requests_frame(1)}, generator_limited=True)
    out = runner.invoke(
        app, ["baseline", "update", "--from", str(limited), "--out", str(tmp_path / "x.json")]
    )
    assert out.exit_code == 2 and "generator-limited" in out.output


def test_planted_faults_are_named_and_never_become_a_baseline(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    faulted = write_run(tmp_path / "b", {"fcfs": requests_frame(2)})
    info = json.loads((faulted / "fcfs" / "run.json").read_text())
    info["faults"] = {"decode_step_delay_s": 0.01}
    (faulted / "fcfs" / "run.json").write_text(json.dumps(info))
    result = run_gate(base, faulted, parse_config(TTFT_P95))
    assert any("planted faults" in n and "decode_step_delay_s" in n for n in result.notes)
    refused = runner.invoke(
        app, ["baseline", "update", "--from", str(faulted), "--out", str(tmp_path / "b.json")]
    )
    assert refused.exit_code == 2 and "planted faults" in " ".join(refused.output.split())


def test_goodput_compares_rates_whatever_the_durations(tmp_path):
    """The same requests met their SLOs, but the current run took twice as long: its
    goodput halved, a regression (the interval used to compare counts, not rates)."""
    frame = requests_frame(1)
    base = write_run(tmp_path / "a", {"fcfs": frame}, durations={"fcfs": 60.0})
    slower = write_run(tmp_path / "b", {"fcfs": frame}, durations={"fcfs": 120.0})
    config = parse_config({"rule": [{"metric": "goodput", "max_regression": 0.05}]})
    (check,) = run_gate(base, slower, config).checks
    assert check.change == pytest.approx(0.5) and check.interval == pytest.approx((0.5, 0.5))
    assert not check.passed
    (same,) = run_gate(base, base, config).checks
    assert same.passed and same.interval == pytest.approx((0.0, 0.0))


def test_a_different_number_of_repeats_is_a_mismatch(tmp_path):
    base = write_run(tmp_path / "a", {f"fcfs-r{k}": requests_frame(k) for k in (1, 2, 3)})
    cur = write_run(tmp_path / "b", {"fcfs": requests_frame(4)})
    with pytest.raises(GateInputError, match="different repeats"):
        run_gate(base, cur, parse_config(TTFT_P95))


def test_cells_are_pooled_only_when_their_run_json_says_they_are_repeats(tmp_path):
    base = write_run(tmp_path / "a", {"fcfs-r1": requests_frame(1), "fcfs-r2": requests_frame(2)})
    for name in ("fcfs-r1", "fcfs-r2"):  # a knob set named r1, r2: not repeats
        info = json.loads((base / name / "run.json").read_text())
        info["repeat"] = None
        (base / name / "run.json").write_text(json.dumps(info))
    result = run_gate(base, base, parse_config(TTFT_P95))
    assert {c.cell for c in result.checks} == {"fcfs-r1", "fcfs-r2"}


def test_itl_from_client_gaps_on_one_side_only_uses_one_estimate_for_both(tmp_path):
    gaps = requests_frame(1).with_columns(
        pl.col("tpot_s")
        .map_elements(lambda t: [t] * 31, return_dtype=pl.List(pl.Float64))
        .alias("itl_s")
    )
    with_gaps = write_run(tmp_path / "a", {"fcfs": gaps})
    without = write_run(tmp_path / "b", {"fcfs": requests_frame(1)})
    config = parse_config({"rule": [{"metric": "itl", "max_regression": 0.05}]})
    for base, cur in ((with_gaps, without), (without, with_gaps)):
        (check,) = run_gate(base, cur, config).checks
        assert check.change == pytest.approx(0.0) and check.passed


def bad_baseline(tmp_path, edit) -> tuple:
    run = write_run(tmp_path / "run", {"fcfs": requests_frame(1, n=20)})
    path = tmp_path / "baseline.json"
    assert (
        runner.invoke(app, ["baseline", "update", "--from", str(run), "--out", str(path)]).exit_code
        == 0
    )
    body = json.loads(path.read_text())
    edit(body)
    path.write_text(json.dumps(body))
    return run, path


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda b: b["cells"]["fcfs"]["rows"][0].__setitem__(4, "many"),
            "rows do not fit the columns",
        ),
        (lambda b: b["cells"].__setitem__("fcfs", [1, 2]), "cell fcfs: expected an object"),
        (lambda b: b["cells"]["fcfs"]["rows"][0].pop(), "rows do not fit the columns"),
        (lambda b: b["cells"]["fcfs"]["rows"].pop(), "not the schedule it records"),
        (lambda b: b["cells"]["fcfs"]["rows"][0].__setitem__(9, float("nan")), "has e2e_s NaN"),
        (lambda b: b.__setitem__("cells", []), "cells: expected an object"),
    ],
)
def test_a_baseline_edited_by_hand_is_a_usage_error(tmp_path, edit, named):
    run, path = bad_baseline(tmp_path, edit)
    result = gate(tmp_path, path, run)
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())


def test_a_nan_latency_in_a_run_is_named(tmp_path):
    frame = requests_frame(1).with_columns(
        pl.when(pl.col("request_id") == "r00007")
        .then(float("nan"))
        .otherwise(pl.col("ttft_s"))
        .alias("ttft_s")
    )
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    cur = write_run(tmp_path / "b", {"fcfs": frame})
    result = gate(tmp_path, base, cur)
    assert result.exit_code == 2 and "request r00007 has ttft_s NaN" in " ".join(
        result.output.split()
    )


def test_the_bootstrap_subsamples_rows_of_a_two_column_array():
    """Estimated ITL resamples (value, weight) rows: past max_rows it must subsample rows,
    not elements (it used to index past the end)."""
    import numpy as np

    from harness.report.stats import paired_block_bootstrap

    rng = np.random.default_rng(0)
    rows = np.column_stack([rng.uniform(0, 1, 12_000), np.ones(12_000)])
    blocks = rng.integers(0, 40, 12_000)
    ci = paired_block_bootstrap((rows, blocks), (rows, blocks), lambda v: float(v[:, 0].mean()),
                                resamples=50, max_rows=10_000)  # fmt: skip
    assert ci is not None and ci[0] <= 0 <= ci[1]


def test_odd_names_make_valid_junit_and_markdown(tmp_path):
    frame = requests_frame(1).with_columns(
        pl.when(pl.col("class") == "short_chat")
        .then(pl.lit("a|b\x07"))
        .otherwise(pl.col("class"))
        .alias("class")
    )
    run = write_run(tmp_path / "a", {"fcfs": frame})
    result = gate(tmp_path, run, run, "--junit", str(tmp_path / "j.xml"))
    assert result.exit_code == 0, result.output
    ET.parse(tmp_path / "j.xml")  # well-formed
    rows = [line for line in result.output.splitlines() if line.startswith("| ✅")]
    assert rows and all(line.count("|") == 12 for line in rows)


def test_an_unwritable_output_is_a_usage_error(tmp_path):
    run = write_run(tmp_path / "a", {"fcfs": requests_frame(1)})
    (tmp_path / "file").write_text("")
    result = gate(tmp_path, run, run, "--junit", str(tmp_path / "file" / "j.xml"))
    assert result.exit_code == 2 and "cannot write" in result.output


def test_several_runs_given_are_pooled_as_repeats(tmp_path):
    """`--baseline A --baseline B`: runs interleaved with the change's (base, head, base,
    head ...) pooled per cell, as a repeated run's cells are."""
    bases = [write_run(tmp_path / f"base{k}", {"fcfs": requests_frame(k)}) for k in (1, 2)]
    heads = [write_run(tmp_path / f"head{k}", {"fcfs": requests_frame(k + 10)}) for k in (1, 2)]
    args = ["gate", "--json", str(tmp_path / "g.json")]
    for b in bases:
        args += ["--baseline", str(b)]
    for h in heads:
        args += ["--current", str(h)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    body = json.loads((tmp_path / "g.json").read_text())
    assert body["sides"]["baseline"]["cells"]["fcfs"]["repeats"] == 2
    other = write_run(tmp_path / "other", {"fcfs": requests_frame(3)}, seed=4)
    refused = runner.invoke(
        app,
        ["gate", "--baseline", str(bases[0]), "--baseline", str(other), "--current", str(heads[0])],
    )
    assert refused.exit_code == 2 and "cannot be pooled" in " ".join(refused.output.split())


def _cut_last(frame: pl.DataFrame, n: int, after_s: float) -> pl.DataFrame:
    """The last ``n`` requests cut in flight ``after_s`` seconds after their arrival."""
    cut = pl.int_range(pl.len()) >= pl.len() - n
    return frame.with_columns(
        pl.when(cut).then(pl.lit("aborted")).otherwise(pl.col("status")).alias("status"),
        pl.when(cut).then(None).otherwise(pl.col("e2e_s")).alias("e2e_s"),
        pl.when(cut).then(pl.col("scheduled_at") + after_s).otherwise(None).alias("cut_at"),
    )


E2E_P95 = {"rule": [{"name": "e2e", "class": "*", "metric": "e2e", "max_regression": 0.05}]}


def test_a_current_run_with_cut_requests_cannot_show_a_pass(tmp_path):
    """30 requests of the current run cut in flight: their survivors alone match the
    baseline's (the pass a survivor-only gate gave), but their E2E is only known to be at
    least 1 s, so no line can pass; the baseline file keeps which rows were censored."""
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1)})
    cut = write_run(tmp_path / "b", {"fcfs": _cut_last(requests_frame(seed=1), 30, 1.0)})
    result = run_gate(base, cut, parse_config(E2E_P95))
    assert result.checks and not any(c.passed for c in result.checks)
    assert all("cut in flight" in c.message for c in result.checks)
    assert result.exit_code == 1
    # the cut requests enter at their bounds, as the censored column says
    frame = result.current.cells["fcfs"].frame
    assert frame["censored"].sum() == 30
    assert (frame.filter(pl.col("censored"))["e2e_s"] == 1.0).all()


def test_a_regression_shown_over_lower_bounds_still_fails(tmp_path):
    """Cut after 60 s (far above every finished E2E): the current run's p95 is at least
    that, a regression that no completion of the cut requests can undo."""
    base = write_run(tmp_path / "a", {"fcfs": requests_frame(seed=1)})
    cut = write_run(tmp_path / "b", {"fcfs": _cut_last(requests_frame(seed=1), 60, 60.0)})
    checks = run_gate(base, cut, parse_config(E2E_P95)).checks
    assert checks and all(not c.passed and c.interval[0] > 0.05 for c in checks)


def test_a_baseline_file_keeps_which_rows_were_censored(tmp_path):
    run = write_run(tmp_path / "a", {"fcfs": _cut_last(requests_frame(seed=1), 30, 1.0)})
    path = tmp_path / "baseline.json"
    made = runner.invoke(app, ["baseline", "update", "--from", str(run), "--out", str(path)])
    assert made.exit_code == 0, made.output
    cell = json.loads(path.read_text())["cells"]["fcfs"]
    assert "censored" in cell["columns"]
    # read back, the baseline's censored rows are counted as the run's were
    result = run_gate(path, run, parse_config(E2E_P95))
    assert result.baseline.cells["fcfs"].frame["censored"].sum() == 30
    assert all("were cut in flight" in c.message for c in result.checks)
