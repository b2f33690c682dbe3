"""The report's Sessions section (docs/report.md, "Sessions"): exact figures on hand-made
sessions — one finished, one ended by a failed turn, one cut by the run's end, one never
started, one long enough for the "6+" bucket — written with the load generator's and the
simulator's own messages; every planned turn counted, failed turns in no percentile, cut
ones at their lower bounds; caching off and unrecorded hit rates never read 0%; the
section rendered (Markdown, HTML, summary.json) only for runs with sessions; and a
simulated ``chat_sessions`` through the real report builder, later turns hitting the
cache more than first turns."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from harness.loadgen.dispatcher import (
    IN_FLIGHT_WHEN_STOPPED,
    NOT_SENT,
    TURN_NOT_SENT,
    session_ended,
)
from harness.profiles import build_plan, resolve_profile
from harness.records.request_stats import STATISTICS
from harness.report import ReportOptions, build_report, generate_report, tables
from harness.report import sessions as ss
from harness.report.validate import check_requests
from harness.simulate.driver import run_simulations
from harness.simulate.session_turns import session_ended_error

OPTIONS = ReportOptions(resamples=20, figures=False)
ON = {"cache": {"enable_prefix_caching": True, "block_size": 16}}

#: (session, class, turn, status, error, scheduled_at, ttft, e2e, prompt, cached,
#:  first_scheduled_at, cut_at)
TURNS = [
    # s1: finished, three turns ok; it took (4.0 + 0.6) - 0.0 = 4.6 s
    ("s1", "chat", 1, "ok", None, 0.0, 0.10, 0.50, 100, 0, 0.01, None),
    ("s1", "chat", 2, "ok", None, 2.0, 0.05, 0.40, 200, 100, 2.01, None),
    ("s1", "chat", 3, "ok", None, 4.0, 0.04, 0.60, 300, 200, 4.01, None),
    # s2: turn 2 failed (admitted, so in the hit rate; not in the TTFT), turn 3 unsent
    ("s2", "chat", 1, "ok", None, 1.0, 0.20, 0.50, 100, 50, 1.01, None),
    ("s2", "chat", 2, "error", "HTTP 500", 3.0, None, None, 200, 100, 3.01, None),
    ("s2", "chat", 3, "aborted", session_ended(2), 3.5, None, None, 300, None, None, None),
    # s3: turn 2 in flight when the run stopped (its TTFT >= 6.0 - 5.0), turn 3 unsent
    ("s3", "chat", 1, "ok", None, 2.0, 0.30, 0.70, 100, 0, 2.01, None),
    ("s3", "chat", 2, "aborted", IN_FLIGHT_WHEN_STOPPED, 5.0, None, None, 200, None, None, 6.0),
    ("s3", "chat", 3, "aborted", TURN_NOT_SENT, 6.0, None, None, 300, None, None, None),
    # s4: the run stopped before its first turn
    ("s4", "chat", 1, "aborted", NOT_SENT, 9.0, None, None, 100, None, None, None),
    ("s4", "chat", 2, "aborted", TURN_NOT_SENT, 9.0, None, None, 200, None, None, None),
    # s5: seven turns ok, turn t: prompt 100 t, cached 100 (t - 1), TTFT 0.01 t
    *[
        (
            "s5",
            "agent",
            t,
            "ok",
            None,
            10.0 + t,
            0.01 * t,
            0.1,
            100 * t,
            100 * (t - 1),
            10.0 + t,
            None,
        )
        for t in range(1, 8)
    ],
]


def _frame(turns=TURNS, singles: int = 2) -> pl.DataFrame:
    """The session rows, then ``singles`` single-turn requests (no session: in no
    figure of the section)."""
    rows = [
        {
            "request_id": f"{t[0]}-t{t[2]}",
            "session_id": t[0],
            "class": t[1],
            "turn": t[2],
            "status": t[3],
            "error": t[4],
            "scheduled_at": t[5],
            "ttft_s": t[6],
            "e2e_s": t[7],
            "prompt_tokens": t[8],
            "cached_tokens": t[9],
            "first_scheduled_at": t[10],
            "cut_at": t[11],
            "phase": 0,
        }
        for t in turns
    ]
    rows += [
        {
            "request_id": f"single{i}",
            "session_id": None,
            "class": "chat",
            "turn": None,
            "status": "ok",
            "error": None,
            "scheduled_at": 20.0 + i,
            "ttft_s": 9.0,
            "e2e_s": 9.5,
            "prompt_tokens": 1000,
            "cached_tokens": 0,
            "first_scheduled_at": 20.0 + i,
            "cut_at": None,
            "phase": 0,
        }
        for i in range(singles)
    ]
    return pl.DataFrame(
        rows,
        schema={
            "request_id": pl.String,
            "session_id": pl.String,
            "class": pl.String,
            "turn": pl.Int64,
            "status": pl.String,
            "error": pl.String,
            "scheduled_at": pl.Float64,
            "ttft_s": pl.Float64,
            "e2e_s": pl.Float64,
            "prompt_tokens": pl.Int64,
            "cached_tokens": pl.Int64,
            "first_scheduled_at": pl.Float64,
            "cut_at": pl.Float64,
            "phase": pl.Int64,
        },
    ).with_columns(output_tokens=pl.lit(4, pl.Int64), max_tokens=pl.lit(4, pl.Int64))


def _sessions(frame: pl.DataFrame, caching: bool | None = True) -> dict | None:
    return ss.sessions(tables.load_requests(frame.lazy(), {}), caching)


def test_the_writers_messages_are_the_ones_the_section_reads():
    # the simulator's and the load generator's "its session ended" rows are told apart
    # from the run's own "not sent" rows by this prefix
    assert session_ended_error(3).startswith(ss.AFTER_FAILURE)
    assert session_ended(3).startswith(ss.AFTER_FAILURE)
    for message in (NOT_SENT, TURN_NOT_SENT):
        assert message.startswith(ss.NOT_SENT) and not message.startswith(ss.AFTER_FAILURE)
    assert IN_FLIGHT_WHEN_STOPPED.startswith(ss.IN_FLIGHT)


def test_each_session_is_finished_failed_cut_or_not_started_and_every_turn_counted():
    out = _sessions(_frame())
    assert out is not None
    chat, agent, overall = out["by_class"]["chat"], out["by_class"]["agent"], out["overall"]
    assert chat["sessions"] == {
        "planned": 4,
        "started": 3,
        "finished": 1,
        "failed": 1,
        "cut": 1,
        "not_started": 1,
    }
    # planned 3 + 3 + 3 + 2; sent: s1 3, s2 2 (the failed one too), s3 2 (the cut one too)
    assert chat["turns"] == {
        "planned": 11,
        "sent": 7,
        "ok": 5,
        "mean_planned": 2.75,
        "mean_sent": 1.75,
    }
    assert chat["rows"] == 11 and agent["rows"] == 7
    # the single-turn requests are in none of it
    assert overall["rows"] == 18
    assert overall["sessions"]["planned"] == 5 and overall["sessions"]["finished"] == 2
    assert overall["turns"]["planned"] == 18 and overall["turns"]["sent"] == 14


def test_outcomes_per_session():
    per = ss.outcomes(ss.session_rows(tables.load_requests(_frame().lazy(), {})))
    got = dict(zip(per["session_id"].to_list(), per["outcome"].to_list(), strict=True))
    assert got == {
        "s1": "finished",
        "s2": "failed",
        "s3": "cut",
        "s4": "not_started",
        "s5": "finished",
    }


def test_ttft_of_first_and_later_turns_ok_measured_cut_at_their_bound_failed_left_out():
    out = _sessions(_frame())
    assert out is not None
    chat = out["by_class"]["chat"]
    first, later = chat["ttft_first_s"], chat["ttft_later_s"]
    # first turns ok: 0.1, 0.2, 0.3 (s4's was never sent)
    assert first["count"] == 3 and "censored" not in first
    assert first["p50"] == pytest.approx(0.2) and first["p95"] == pytest.approx(0.29)
    # later turns: s1's 0.05 and 0.04, s3's cut turn at >= 1.0; s2's failed turn in none
    assert later["count"] == 3 and later["censored"] == 1
    assert later["p50"] == pytest.approx(0.05)  # exact: the cut turn lies above it
    assert later["p95"] == pytest.approx(0.05 + 0.9 * 0.95)
    assert later["lower_bound"] == [s for s in STATISTICS if s not in ("p50",)]


def test_hit_rate_by_turn_over_the_admitted_turns_and_the_tail_bucket():
    out = _sessions(_frame())
    assert out is not None and out["tail_turn"] == 6 and out["hit_rate_note"] is None
    chat = out["by_class"]["chat"]
    by = chat["hit_rate_by_turn"]
    assert list(by) == ["1", "2", "3"]
    # turn 1: s1 0/100, s2 50/100, s3 0/100 (s4's never admitted)
    assert (by["1"]["requests"], by["1"]["prompt_tokens"], by["1"]["cached_tokens"]) == (3, 300, 50)
    assert by["1"]["hit_rate"] == pytest.approx(1 / 6)
    # turn 2: s1 100/200 and s2's failed but admitted 100/200 (s3's cut turn was not)
    assert (by["2"]["requests"], by["2"]["hit_rate"]) == (2, pytest.approx(0.5))
    assert (by["3"]["requests"], by["3"]["hit_rate"]) == (1, pytest.approx(2 / 3))
    assert chat["hit_rate_first"]["hit_rate"] == pytest.approx(1 / 6)
    assert chat["hit_rate_later"]["requests"] == 3
    assert chat["hit_rate_later"]["hit_rate"] == pytest.approx(400 / 700)
    agent = out["by_class"]["agent"]["hit_rate_by_turn"]
    assert list(agent) == ["1", "2", "3", "4", "5", "6+"]
    # turns 6 and 7 together: (500 + 600) / (600 + 700)
    assert agent["6+"]["requests"] == 2
    assert agent["6+"]["hit_rate"] == pytest.approx(1100 / 1300)
    assert agent["5"]["hit_rate"] == pytest.approx(400 / 500)


def test_duration_of_the_finished_sessions_only():
    out = _sessions(_frame())
    assert out is not None
    chat = out["by_class"]["chat"]["duration_s"]
    assert chat == {"count": 1, "mean": pytest.approx(4.6), "p50": pytest.approx(4.6),
                    "p95": pytest.approx(4.6)}  # fmt: skip
    # s5: first send 11.0, last token 17.0 + 0.1
    overall = out["overall"]["duration_s"]
    assert overall["count"] == 2
    assert overall["mean"] == pytest.approx((4.6 + 6.1) / 2)
    assert overall["p95"] == pytest.approx(4.6 + 0.95 * 1.5)


def test_caching_off_and_unrecorded_hit_rates_are_never_zero():
    off = _sessions(_frame(), caching=False)
    assert off is not None and off["hit_rate_note"] == "prefix caching off"
    for g in (off["overall"], *off["by_class"].values()):
        assert g["hit_rate_first"]["hit_rate"] is None
        assert all(h["hit_rate"] is None for h in g["hit_rate_by_turn"].values())
    blind = _sessions(_frame().drop("cached_tokens"))
    assert blind is not None and blind["hit_rate_note"] == ss.NOT_RECORDED
    assert blind["overall"]["hit_rate_by_turn"]["1"] == {
        "requests": 0,
        "prompt_tokens": None,
        "cached_tokens": None,
        "hit_rate": None,
    }
    # the completion figures do not need the cache
    assert blind["overall"]["sessions"]["finished"] == 2


def test_no_session_rows_no_section():
    assert _sessions(_frame(turns=[])) is None
    assert _sessions(_frame().drop("session_id", "turn")) is None


def test_a_session_row_without_a_turn_is_a_broken_cell(tmp_path):
    path = tmp_path / "requests.parquet"
    _frame().with_columns(
        turn=pl.when(pl.col("request_id") == "s1-t2").then(None).otherwise(pl.col("turn"))
    ).write_parquet(path)
    assert check_requests(path) == [
        "1 session row(s) (session_id set) without a turn of 1 or more (first: request s1-t2)"
    ]
    _frame().write_parquet(path)
    assert check_requests(path) == []


# -- rendered -------------------------------------------------------------------------


def _write_run(root: Path, frame: pl.DataFrame, config: dict = ON) -> Path:
    (root / "fcfs").mkdir(parents=True)
    frame.write_parquet(root / "fcfs" / "requests.parquet")
    summary = {"mode": "simulate", "profile": "mixed", "policies": {"fcfs": {"config": config}}}
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _table(section: str, first_header: str) -> dict[str, dict[str, str]]:
    """The rows (by class) of the table whose header row starts with ``first_header``."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header}"))
    headers = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[2]] = dict(zip(headers, cells, strict=True))
    return rows


def test_the_section_is_rendered_with_its_counts(tmp_path):
    paths = generate_report([_write_run(tmp_path / "run", _frame())], options=OPTIONS)
    entry = json.loads(paths["summary"].read_text())["policies"]["fcfs"]["sessions"]
    assert entry["by_class"]["chat"]["sessions"]["cut"] == 1
    assert entry["overall"]["hit_rate_by_turn"]["6+"]["requests"] == 2
    section = _section(paths["markdown"].read_text(), "Sessions")
    assert (
        # first turns: 0.01, 0.1, 0.2, 0.3; later: the agent's 0.02 ... 0.07, the chat's
        # 0.04 and 0.05 and its cut turn (>= 1.0); hits (400 + 2100) / (700 + 2700) and
        # (50 + 0) / (300 + 100)
        "run/fcfs: later turns: TTFT p50 50 ms vs 150 ms on first turns (9 and 4 turns); "
        "hit rate 73.5% vs 12.5% on first turns (9 and 4 admitted turns); 2 of 5 sessions "
        "finished, 1 ended by a failed turn, 1 cut by the run's end, 1 not started"
    ) in section
    counts = _table(section, "run | policy | class | sessions")
    chat = counts["chat"]
    assert [chat[k] for k in ("sessions", "finished", "failed", "cut", "not started")] == [
        "4",
        "1",
        "1",
        "1",
        "1",
    ]
    assert (chat["turns planned"], chat["turns sent"]) == ("11", "7")
    assert (chat["TTFT p50 turn 1"], chat["n turn 1"]) == ("200 ms", "3")
    # the cut turn bounds p95 from below; p50 is exact
    assert (chat["TTFT p50 later"], chat["TTFT p95 later"], chat["n later"]) == (
        "50 ms",
        "≥ 905 ms",
        "3",
    )
    assert (chat["duration mean"], chat["n finished"]) == ("4.60 s", "1")
    hits = _table(section, "run | policy | class | turn 1")
    assert hits["chat"]["turn 1"] == "16.7% (3)" and hits["chat"]["turn 6+"] == "–"
    assert hits["agent"]["turn 6+"] == "84.6% (2)"
    assert hits["all"]["turns ≥ 2"] == "73.5% (9)"
    page = paths["html"].read_text()
    assert 'id="sessions"' in page and "84.6% (2)" in page


def test_a_turn_none_of_whose_rows_was_admitted_reads_a_dash_not_zero(tmp_path):
    # s3 (turn 2 cut, turn 3 unsent) and s4 (never started): turns 2 and 3 planned,
    # none of their rows admitted
    frame = _frame(turns=[t for t in TURNS if t[0] in ("s3", "s4")])
    paths = generate_report([_write_run(tmp_path / "run", frame)], options=OPTIONS)
    entry = json.loads(paths["summary"].read_text())["policies"]["fcfs"]["sessions"]
    assert entry["hit_rate_note"] is None
    assert entry["overall"]["hit_rate_by_turn"]["3"] == {
        "requests": 0,
        "prompt_tokens": None,
        "cached_tokens": None,
        "hit_rate": None,
    }
    hits = _table(
        _section(paths["markdown"].read_text(), "Sessions"), "run | policy | class | turn 1"
    )
    assert hits["chat"]["turn 1"] == "0.0% (1)"
    assert hits["chat"]["turn 2"] == hits["chat"]["turn 3"] == "– (0)"
    assert hits["chat"]["turns ≥ 2"] == "– (0)"


def test_caching_off_is_said_in_the_section(tmp_path):
    off = {"cache": {"enable_prefix_caching": False}}
    paths = generate_report([_write_run(tmp_path / "run", _frame(), off)], options=OPTIONS)
    section = _section(paths["markdown"].read_text(), "Sessions")
    assert "(9 and 4 turns); hit rate prefix caching off; 2 of 5 sessions" in section
    hits = _table(section, "run | policy | class | turn 1")
    assert hits["chat"]["turn 1"] == "prefix caching off (3)"
    assert "%" not in "".join(c for row in hits.values() for c in row.values())


def test_a_run_without_sessions_has_no_section(tmp_path):
    paths = generate_report([_write_run(tmp_path / "run", _frame(turns=[]))], options=OPTIONS)
    assert "## Sessions" not in paths["markdown"].read_text()
    assert 'id="sessions"' not in paths["html"].read_text()
    assert json.loads(paths["summary"].read_text())["policies"]["fcfs"]["sessions"] is None


def test_simulated_chat_sessions_later_turns_hit_the_cache_more(tmp_path):
    profile = resolve_profile("chat_sessions").with_duration_scale(0.2)
    run_simulations(profile, {"fcfs": EngineConfig()}, CostModel(), tmp_path / "sim")
    report = build_report([tmp_path / "sim"], OPTIONS)
    entry = report.runs[0].policies["fcfs"].sessions
    assert entry is not None
    overall = entry["overall"]
    plan = build_plan(profile)
    planned = plan.sessions()
    # every planned session and turn is there, and the simulator finishes them all
    assert overall["sessions"]["planned"] == len(planned) > 5
    assert overall["sessions"]["finished"] == len(planned)
    assert overall["turns"]["planned"] == sum(len(s.turns) for s in planned)
    assert overall["ttft_first_s"]["count"] == len(planned)
    # later turns re-send the conversation the cache holds
    first, later = overall["hit_rate_first"]["hit_rate"], overall["hit_rate_later"]["hit_rate"]
    assert later > first
    assert (
        overall["hit_rate_by_turn"]["2"]["hit_rate"] > overall["hit_rate_by_turn"]["1"]["hit_rate"]
    )
    assert set(entry["by_class"]) == {"support", "assistant"}
    # and the run has no rungs: no ladder
    assert report.runs[0].cache_ladder is None
