"""The report's Cache ladder (docs/report.md, "Cache ladder"): exact figures per rung on
hand-made rows of the shipped ``cache_ladder`` profile (TTFT over the ok rows with a cut
one at its bound and a failed one left out, throughput over the rung's span, the hit rate
over its admitted rows), rungs from phase names when the profile's phases carry no
``prefix_reuse`` (and the rows of other phases said, not dropped), no ladder without a
readable profile, the section and its figure rendered only for a ladder run, and a
simulated ``cache_ladder`` through the real report builder: five rungs, the hit rate
rising with the reuse."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.loadgen.dispatcher import IN_FLIGHT_WHEN_STOPPED
from harness.profiles import resolve_profile
from harness.report import ReportOptions, build_report, generate_report, tables
from harness.report import cache_ladder as cl
from harness.simulate.driver import run_simulations
from tests.support.report_browser import chromium_required, find_chromium, inspect_html

OPTIONS = ReportOptions(resamples=20, figures=False)
ON = {"cache": {"enable_prefix_caching": True, "block_size": 16}}
RUNGS = ["reuse_0", "reuse_25", "reuse_50", "reuse_75", "reuse_90"]

#: (phase, status, error, scheduled_at, ttft, e2e, output, prompt, cached,
#:  first_scheduled_at, cut_at)
ROWS = [
    # reuse_0: two ok (TTFT 0.2, 0.4; the last token at 1.0 + 2.0), one failed after
    # its admission (in the hit rate, in no TTFT): span 3.0 s, 2 ok, 30 tokens
    (0, "ok", None, 0.0, 0.2, 1.0, 10, 100, 0, 0.1, None),
    (0, "ok", None, 1.0, 0.4, 2.0, 20, 100, 0, 1.1, None),
    (0, "error", "HTTP 500", 2.0, None, None, None, 100, 0, 2.1, None),
    # reuse_25: two ok (last token at 11.0 + 1.0), one cut in flight 1.0 s after its send
    # (TTFT >= 1.0; never admitted: in no hit rate)
    (1, "ok", None, 10.0, 0.1, 0.5, 5, 100, 25, 10.1, None),
    (1, "ok", None, 11.0, 0.2, 1.0, 5, 100, 25, 11.1, None),
    (1, "aborted", IN_FLIGHT_WHEN_STOPPED, 13.0, None, None, None, 100, None, None, 14.0),
    # one ok request each; reuse_50 also one that failed after its first token (its
    # TTFT and end measured, in no figure but the hit rate: the span ends at 20.25)
    (2, "ok", None, 20.0, 0.05, 0.25, 8, 100, 50, 20.01, None),
    (2, "error", "stream broke", 20.1, 0.1, 3.0, 2, 100, 50, 20.11, None),
    (3, "ok", None, 30.0, 0.04, 0.5, 8, 100, 75, 30.01, None),
    (4, "ok", None, 40.0, 0.02, 0.2, 4, 100, 90, 40.01, None),
]


def _frame(rows=ROWS) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "request_id": f"r{i}",
                "class": "doc_qa",
                "phase": r[0],
                "status": r[1],
                "error": r[2],
                "scheduled_at": r[3],
                "ttft_s": r[4],
                "e2e_s": r[5],
                "output_tokens": r[6],
                "prompt_tokens": r[7],
                "cached_tokens": r[8],
                "first_scheduled_at": r[9],
                "cut_at": r[10],
                "max_tokens": 128,
            }
            for i, r in enumerate(rows)
        ],
        schema_overrides={
            "ttft_s": pl.Float64,
            "e2e_s": pl.Float64,
            "output_tokens": pl.Int64,
            "cached_tokens": pl.Int64,
            "first_scheduled_at": pl.Float64,
            "cut_at": pl.Float64,
            "error": pl.String,
        },
    )


def _ladder(frame: pl.DataFrame, profile="cache_ladder", caching: bool | None = True):
    loaded = tables.load_requests(frame.lazy(), {})
    resolved = resolve_profile(profile) if isinstance(profile, str | Path) else profile
    return cl.cache_ladder(resolved, "test", {"fcfs": (loaded, caching)})


def test_each_rung_s_figures_over_its_own_rows():
    out = _ladder(_frame())
    assert out is not None
    assert out["source"] == cl.FROM_PREFIX_REUSE and out["profile"] == "cache_ladder"
    assert [r["name"] for r in out["rungs"]] == RUNGS
    assert [r["prefix_reuse"] for r in out["rungs"]] == [0.0, 0.25, 0.5, 0.75, 0.9]
    assert out["notes"] == []
    by = out["policies"]["fcfs"]
    zero = by["reuse_0"]
    assert (zero["requests"], zero["ok"]) == (3, 2)
    # the failed request is in no percentile
    assert zero["ttft_s"]["count"] == 2
    assert zero["ttft_s"]["p50"] == pytest.approx(0.3)
    assert zero["ttft_s"]["p95"] == pytest.approx(0.39)
    assert zero["span_s"] == pytest.approx(3.0)
    assert zero["throughput_rps"] == pytest.approx(2 / 3)
    assert zero["output_tokens_per_s"] == pytest.approx(10.0)
    # admitted, failed: its prompt was looked up, so it is in the hit rate
    assert (zero["hit_rate_requests"], zero["prompt_tokens"], zero["cached_tokens"]) == (3, 300, 0)
    assert zero["hit_rate"] == 0.0
    quarter = by["reuse_25"]
    # the cut request at its bound: 1.0 s
    assert quarter["ttft_s"]["count"] == 3 and quarter["ttft_s"]["censored"] == 1
    assert quarter["ttft_s"]["p50"] == pytest.approx(0.2)
    assert "p50" not in quarter["ttft_s"]["lower_bound"]
    assert "p95" in quarter["ttft_s"]["lower_bound"]
    assert quarter["span_s"] == pytest.approx(2.0)
    assert quarter["throughput_rps"] == pytest.approx(1.0)
    assert quarter["output_tokens_per_s"] == pytest.approx(5.0)
    assert (quarter["hit_rate_requests"], quarter["hit_rate"]) == (2, pytest.approx(0.25))
    assert [by[r]["hit_rate"] for r in RUNGS[2:]] == [0.5, 0.75, 0.9]
    half = by["reuse_50"]
    assert (half["requests"], half["ok"], half["hit_rate_requests"]) == (2, 1, 2)
    assert half["ttft_s"]["count"] == 1 and half["ttft_s"]["p50"] == pytest.approx(0.05)
    assert half["span_s"] == pytest.approx(0.25)
    assert half["throughput_rps"] == pytest.approx(4.0)
    assert half["output_tokens_per_s"] == pytest.approx(32.0)
    assert by["reuse_90"]["output_tokens_per_s"] == pytest.approx(20.0)


def test_caching_off_has_no_hit_rate_and_says_so():
    out = _ladder(_frame(), caching=False)
    assert out is not None
    assert all(r["hit_rate"] is None for r in out["policies"]["fcfs"].values())
    assert out["notes"] == ["fcfs: prefix caching off: no hit rates"]
    # the rest stands
    assert out["policies"]["fcfs"]["reuse_0"]["ttft_s"]["count"] == 2


NAMED = """
name = "named_ladder"
seed = 1
[[classes]]
name = "doc_qa"
prompt_tokens = {{ kind = "fixed", value = 100 }}
output_tokens = {{ kind = "fixed", value = 8 }}
{phases}
"""


def _toml(path: Path, phases: list[str]) -> Path:
    text = "".join(f'[[phases]]\nname = "{name}"\nduration_s = 10\nrate = 1.0\n' for name in phases)
    path.write_text(NAMED.format(phases=text))
    return path


def test_rungs_from_the_phase_names_when_no_phase_has_prefix_reuse(tmp_path):
    profile = _toml(tmp_path / "named.toml", ["warmup", "reuse_0", "reuse_50"])
    # phase 0 is the warm-up: its two rows are in no rung, and said
    rows = [(0, *ROWS[0][1:]), (0, *ROWS[1][1:]), (1, *ROWS[3][1:]), (2, *ROWS[6][1:])]
    out = _ladder(_frame(rows), profile)
    assert out is not None and out["source"] == cl.FROM_NAMES
    assert out["rungs"] == [
        {"phase": 1, "name": "reuse_0", "prefix_reuse": 0.0},
        {"phase": 2, "name": "reuse_50", "prefix_reuse": 0.5},
    ]
    assert out["policies"]["fcfs"]["reuse_0"]["hit_rate"] == pytest.approx(0.25)
    assert out["policies"]["fcfs"]["reuse_50"]["hit_rate"] == pytest.approx(0.5)
    assert out["notes"] == ["fcfs: 2 row(s) of phases that are not rungs: in no rung"]


def test_no_rungs_no_ladder_and_rows_of_another_profile_said(tmp_path):
    assert _ladder(_frame(), "mixed") is None
    assert _ladder(_frame(), _toml(tmp_path / "plain.toml", ["a", "b"])) is None
    assert cl.cache_ladder(None, None, {}) is None
    two = _toml(tmp_path / "two.toml", ["reuse_0", "reuse_90"])
    out = _ladder(_frame(), two)  # rows of phases 0 to 4
    assert out is not None and out["policies"] == {}
    assert out["notes"] == [
        "fcfs: its rows have phase 4, profile 'named_ladder' has 2 phases: not its profile"
    ]
    out = _ladder(_frame().with_columns(phase=pl.lit(None, pl.Int64)))
    assert out is not None and out["policies"] == {}
    assert out["notes"] == ["fcfs: requests.parquet has no phase: its rungs cannot be told apart"]


# -- rendered -------------------------------------------------------------------------


def _write_run(root: Path, frame: pl.DataFrame, profile: str) -> Path:
    (root / "fcfs").mkdir(parents=True)
    frame.write_parquet(root / "fcfs" / "requests.parquet")
    summary = {"mode": "simulate", "profile": profile, "policies": {"fcfs": {"config": ON}}}
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def _section(md: str) -> str:
    return md.split("## Cache ladder\n", 1)[1].split("\n## ", 1)[0]


def test_the_section_table_and_figure_are_rendered(tmp_path):
    root = _write_run(tmp_path / "ladder", _frame(), "cache_ladder")
    paths = generate_report([root], options=ReportOptions(resamples=20))
    summary = json.loads(paths["summary"].read_text())
    assert summary["cache_ladder"]["policies"]["fcfs"]["reuse_25"]["hit_rate"] == 0.25
    assert summary["runs"]["ladder"]["cache_ladder"] == summary["cache_ladder"]
    assert summary["cache_ladder"]["profile_source"] == "summary.json profile"
    section = _section(paths["markdown"].read_text())
    rows = {
        cells[2]: cells[3:]
        for line in section.splitlines()
        if line.startswith("| ladder ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows["requests ok / all"] == ["2 / 3", "2 / 3", "1 / 2", "1 / 1", "1 / 1"]
    assert rows["TTFT p50"][:2] == ["300 ms", "200 ms"]
    assert rows["TTFT p95"][1].startswith("≥ ")
    assert rows["TTFT n"] == ["2", "3", "1", "1", "1"]
    assert rows["span"][:2] == ["3.00 s", "2.00 s"]
    assert rows["req/s"] == ["0.67", "1.00", "4.00", "2.00", "5.00"]
    assert rows["hit rate"] == ["0.0%", "25.0%", "50.0%", "75.0%", "90.0%"]
    assert rows["hit-rate n"] == ["3", "2", "2", "1", "1"]
    assert "ladder/fcfs: reuse_0 → reuse_90: TTFT p50 300 ms → 20 ms" in section
    page = paths["html"].read_text()
    assert 'id="cache-ladder"' in page
    assert page.count('data-section="ladder"') == 1


@pytest.mark.chromium
def test_the_ladder_figure_draws_in_headless_chromium(tmp_path):
    if find_chromium() is None:
        if chromium_required():
            pytest.fail("chromium is required in CI (make system-deps installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    root = _write_run(tmp_path / "ladder", _frame(), "cache_ladder")
    paths = generate_report([root], options=ReportOptions(resamples=20))
    result = inspect_html(paths["html"], tmp_path / "ladder.png")
    dom = result["dom"]
    assert result["errors"] == []
    assert dom["plots"] == dom["declared"] == dom["drawn"], dom
    # TTFT p50, p95 and the hit rate of its one policy
    assert dom["traces"][dom["sections"].index("ladder")] == 3, dom


def test_a_run_without_rungs_has_no_section(tmp_path):
    root = _write_run(tmp_path / "plain", _frame(), "mixed")
    paths = generate_report([root], options=ReportOptions(resamples=20))
    assert "## Cache ladder" not in paths["markdown"].read_text()
    assert 'data-section="ladder"' not in paths["html"].read_text()
    summary = json.loads(paths["summary"].read_text())
    assert "cache_ladder" not in summary and "cache_ladder" not in summary["runs"]["plain"]


def test_the_run_s_own_profile_before_profile_option(tmp_path):
    # --profile names the SLOs' profile; the rows' phases are the run's own profile's
    root = _write_run(tmp_path / "ladder", _frame(), "cache_ladder")
    report = build_report([root], ReportOptions(resamples=20, figures=False, profile="mixed"))
    assert report.runs[0].slo_source == "profile 'mixed' (--profile)"
    ladder = report.runs[0].cache_ladder
    assert ladder is not None and ladder["profile"] == "cache_ladder"


def test_simulated_cache_ladder_five_rungs_hit_rate_rising(tmp_path):
    profile = resolve_profile("cache_ladder").with_duration_scale(0.2)
    configs = {
        "fcfs": EngineConfig(),
        "sjf": EngineConfig(SchedulerConfig(scheduling_policy="sjf")),
    }
    run_simulations(profile, configs, CostModel(), tmp_path / "sim")
    report = build_report([tmp_path / "sim"], OPTIONS)
    ladder = report.runs[0].cache_ladder
    assert ladder is not None
    assert [r["name"] for r in ladder["rungs"]] == RUNGS
    assert set(ladder["policies"]) == {"fcfs", "sjf"}
    frame = report.runs[0].policies["fcfs"].frame
    for policy, by in ladder["policies"].items():
        rates = [by[r]["hit_rate"] for r in RUNGS]
        assert rates[0] == 0.0, policy  # the control rung shares nothing
        assert all(a < b for a, b in zip(rates, rates[1:], strict=False)), (policy, rates)
        # every row of the run is in its rung
        assert sum(by[r]["requests"] for r in RUNGS) == frame.height
        assert by["reuse_90"]["ttft_s"]["p50"] < by["reuse_0"]["ttft_s"]["p50"]
        assert all(by[r]["throughput_rps"] > 0 for r in RUNGS)
    # a ladder run has no sessions
    assert report.runs[0].policies["fcfs"].sessions is None
