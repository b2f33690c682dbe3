"""The one-line session summary ``schedscope run`` prints under a cell."""

from __future__ import annotations

import polars as pl

from harness.run.session_summary import session_line, session_summary


def test_first_and_later_turn_hit_rates_over_the_turns_that_ended_ok():
    frame = pl.DataFrame(
        {
            "session_id": ["a", "a", "a", "b", "b", None],
            "turn": [1, 2, 3, 1, 2, None],
            "status": ["ok", "ok", "error", "ok", "aborted", "ok"],
            "prompt_tokens": [100, 200, 300, 100, 250, 50],
            "cached_tokens": [0, 150, 280, 50, None, 40],
        }
    )
    summary = session_summary(frame)
    assert summary == {
        "sessions": 2,
        "turns": 5,
        "turns_ok": 3,
        "first_turn_hit_rate": 50 / 200,
        "later_turn_hit_rate": 150 / 200,  # the failed and the unsent turns left out
    }
    assert session_line(summary) == (
        "2 sessions, 5 turns (3 ok); prefix cache hit rate: turns >= 2 75.0%, first turns 25.0%"
    )


def test_no_session_no_summary():
    frame = pl.DataFrame({"session_id": [None, None], "turn": [None, None]})
    assert session_summary(frame) is None
    assert session_summary(pl.DataFrame({"request_id": ["x"]})) is None
