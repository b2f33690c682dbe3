"""End to end: ``schedscope simulate`` runs, then ``schedscope report`` on them: files,
summary.json contents, a plot per section, the diagnosis on runs built to fall into
each trap (silent on a light run), the headline comparisons in words, and the HTML in
real headless chromium."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.paths import DATA
from tests.support.report_browser import chromium_required, find_chromium, inspect_html

pytestmark = [pytest.mark.chromium, pytest.mark.slow]

DATA = DATA
runner = CliRunner()


def _cli(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _report(run: Path, *extra: str) -> dict:
    out = _cli("report", str(run), *extra)
    assert f"report: {run / 'report.html'}" in out.replace("\n", "")
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("report") / "default"
    # 1.2x: the burst's queue makes priority preempt (its stalls are the report's to
    # attribute); since prefill attention is grouped by size, no inter-token gap of fcfs
    # or sjf reaches the 250 ms stall floor at this load.
    _cli(
        "simulate",
        "--profile",
        "default",
        "--policy",
        "fcfs,sjf,priority",
        "--rate-scale",
        "1.2",
        "--trace-file",
        str(run / "spans.jsonl"),
        "--out",
        str(run),
    )
    _report(run)
    return run


def test_report_files_and_summary(default_run: Path):
    for name in ("report.html", "report.md", "summary.json", "stalls.parquet", "classes.parquet"):
        assert (default_run / name).is_file(), name
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["schema_version"] == 2 and summary["kind"] == "schedscope-report"
    assert summary["profile"] == "mixed" and summary["mode"] == "simulate"  # default is its alias
    assert set(summary["policies"]) == {"fcfs", "sjf", "priority"}
    for p in summary["policies"].values():
        assert set(p["classes"]) == {"short_chat", "long_generation"}
        g = p["classes"]["short_chat"]
        for key in (
            "requests",
            "counts",
            "throughput_rps",
            "output_tokens_per_s",
            "goodput_rps",
            "slo_attainment",
            "metrics",
            "itl_s",
            "preemptions",
            "stalls_by_cause",
            "jain_index",
            "generator_lag_s",
        ):
            assert key in g, key
        for metric in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
            assert {"p50", "p95", "p99", "max", "mean"} <= set(g["metrics"][metric])
        assert g["generator_lag_s"] is None  # a simulation has no generator lag
        if p["overall"]["stalls"]:  # evidence is looked up for the stalls there are
            assert p["stall_sources"] == {
                "preemptions": "spans",
                "token_budget": "decisions",
                "prefill_interference": "steps",
            }
        assert p["config"]["scheduler"]["scheduling_policy"] in summary["policies"]
    assert set(summary["verdicts"]) == {"short_ttft", "tail_e2e", "goodput", "fairness"}
    for v in summary["verdicts"].values():
        assert v["winner"] in summary["policies"] and "beyond_noise" in v
    assert summary["policies"]["priority"]["overall"]["stalls"] > 0
    stalls = pl.read_parquet(default_run / "stalls.parquet")
    assert set(stalls.columns) >= {"run", "policy", "request_id", "start_s", "duration_s", "cause"}
    total = sum(p["overall"]["stalls"] for p in summary["policies"].values())
    assert stalls.height == total
    # the report's summary.json is read back as the run's info: a second report is the same
    again = _report(default_run)
    assert again["policies"]["fcfs"]["overall"] == summary["policies"]["fcfs"]["overall"]
    assert again["profile"] == "mixed"


def test_headline_sjf_lowers_short_class_mean_ttft_in_words(default_run: Path):
    summary = json.loads((default_run / "summary.json").read_text())
    sjf = next(
        c
        for c in summary["against_fcfs"]
        if c["policy"] == "sjf" and c["metric"].startswith("mean TTFT")
    )
    assert sjf["class"] == "short_chat"
    assert sjf["lower_than_fcfs"], sjf
    text = (default_run / "report.md").read_text()
    assert "SJF lowers mean TTFT of 'short_chat' against FCFS" in text


def test_light_run_flags_no_trap(default_run: Path):
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["diagnosis"] == []
    assert "No known trap flagged" in (default_run / "report.md").read_text()


def test_html_has_a_plot_per_section(default_run: Path):
    html = (default_run / "report.html").read_text()
    for section in ("cdf", "timeline", "stalls", "waterfall"):
        assert f'data-section="{section}"' in html, section
    # self-contained: plotly.js inlined once, nothing fetched (the bundle itself mentions
    # its CDN in strings for map and MathJax features the report does not use)
    assert "<script src=" not in html and "<link " not in html
    assert html.count("Plotly.newPlot") >= 7 and html.count("plotly.js v") <= 2


def test_html_opens_in_headless_chromium(default_run: Path, tmp_path_factory):
    if find_chromium() is None:
        if chromium_required():
            pytest.fail("chromium is required in CI (make system-deps installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    shot = tmp_path_factory.mktemp("artifacts") / "report.png"
    result = inspect_html(default_run / "report.html", shot)
    dom = result["dom"]
    assert result["errors"] == []
    assert dom["plots"] == dom["declared"] == dom["drawn"] and dom["plots"] >= 7, dom
    assert all(n > 0 for n in dom["traces"]), dom
    assert set(dom["sections"]) == {"cdf", "timeline", "stalls", "waterfall"}
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("SCHEDSCOPE_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report.png")


def test_missing_files_are_reported_and_the_rest_renders(default_run: Path, tmp_path):
    run = tmp_path / "partial"
    (run / "fcfs").mkdir(parents=True)
    (run / "sjf").mkdir()
    shutil.copy(default_run / "fcfs" / "requests.parquet", run / "fcfs")
    for name in ("requests", "steps"):
        shutil.copy(default_run / "sjf" / f"{name}.parquet", run / "sjf")
    summary = _report(run, "--profile", "default")
    missing = "\n".join(summary["missing"])
    assert "partial/fcfs: spans.parquet" in missing and "partial/sjf: decisions.parquet" in missing
    assert summary["policies"]["fcfs"]["overall"]["requests"] > 0
    html = (run / "report.html").read_text()
    assert "Missing data" in html and 'data-section="timeline"' in html  # sjf's steps


def test_several_runs_side_by_side(default_run: Path, tmp_path):
    other = tmp_path / "other"
    _cli(
        "simulate",
        "--profile",
        "default",
        "--policy",
        "fcfs,sjf",
        "--rate-scale",
        "0.3",
        "--out",
        str(other),
    )
    out = tmp_path / "cmp"
    _cli("report", str(default_run), str(other), "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run_labels"] == ["default", "other"]
    assert set(summary["runs"]["other"]["policies"]) == {"fcfs", "sjf"}
    assert "| other | sjf | short_chat |" in (out / "report.md").read_text()


def _traps(summary: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in summary["diagnosis"]:
        out.setdefault(f["policy"], []).append(f["trap"])
    return out


def test_trap_starvation_and_max_wait_fix(tmp_path):
    profile = str(DATA / "report_starvation.toml")
    run = tmp_path / "starve"
    _cli(
        "simulate",
        "--profile",
        profile,
        "--policy",
        "fcfs,sjf",
        "--max-num-seqs",
        "4",
        "--out",
        str(run),
    )
    summary = _report(run, "--profile", profile)
    assert _traps(summary) == {"sjf": ["starvation"]}
    finding = summary["diagnosis"][0]
    assert (
        finding["evidence"]["long_p99_queue_s"] > 2 * finding["evidence"]["fcfs_long_p99_queue_s"]
    )
    assert "--max-wait-s" in finding["knob"] and finding["worst_requests"]
    text = (run / "report.md").read_text()
    assert "SJF raises p99 queue wait of 'long' against FCFS" in text
    fixed = tmp_path / "fixed"
    _cli(
        "simulate",
        "--profile",
        profile,
        "--policy",
        "fcfs,sjf",
        "--max-num-seqs",
        "4",
        "--max-wait-s",
        "3",
        "--out",
        str(fixed),
    )
    assert _traps(_report(fixed, "--profile", profile)) == {}


def test_trap_idle_running(tmp_path):
    profile = str(DATA / "report_idle.toml")
    run = tmp_path / "idle"
    _cli(
        "simulate",
        "--profile",
        profile,
        "--no-enable-chunked-prefill",
        "--max-model-len",
        "64",
        "--max-num-batched-tokens",
        "64",
        "--max-num-seqs",
        "256",
        "--out",
        str(run),
    )
    summary = _report(run, "--profile", profile)
    assert _traps(summary) == {"fcfs": ["idle_running"]}
    assert "--max-num-batched-tokens" in summary["diagnosis"][0]["knob"]


def test_trap_swap_fallback_and_memory_pressure(tmp_path):
    run = tmp_path / "swap"
    # A host pool of 32 blocks: some preemptions swap, the rest fall back to recompute
    # (with the built-in model: 4 swapped-out and 3 recompute stalls, 16 fallbacks; with
    # 8 blocks nearly every swap fell back, leaving no swapped-out stall to attribute).
    _cli(
        "simulate",
        "--profile",
        "default",
        "--rate-scale",
        "0.5",
        "--num-gpu-blocks-override",
        "400",
        "--num-cpu-blocks-override",
        "32",
        "--preemption-mode",
        "swap",
        "--out",
        str(run),
    )
    summary = _report(run)
    assert _traps(summary) == {"fcfs": ["swap_fallback", "memory_pressure"]}
    fallback = summary["diagnosis"][0]
    assert fallback["evidence"]["swap_fallbacks"] > 0 and "--swap-space" in fallback["knob"]
    by_cause = summary["policies"]["fcfs"]["overall"]["stalls_by_cause"]
    assert by_cause["recompute"]["count"] > 0 and by_cause["swapped_out"]["count"] > 0
    small = tmp_path / "small"
    _cli(
        "simulate",
        "--profile",
        "default",
        "--rate-scale",
        "0.5",
        "--num-gpu-blocks-override",
        "80",
        "--out",
        str(small),
    )
    summary = _report(small)
    assert _traps(summary) == {"fcfs": ["memory_pressure"]}
    assert summary["diagnosis"][0]["evidence"]["exceeds_kv_pool_rejections"] > 0
