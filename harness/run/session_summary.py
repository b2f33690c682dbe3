"""A cell's sessions in one line: how many, and how much of their turns' prompts the
prefix cache held — the first turns' against the later ones' (those re-send the
conversation, so they should hit far more). Printed under the cell by ``schedscope
run`` and kept in its run.json as ``sessions``; the report has the full section."""

from __future__ import annotations

import polars as pl


def session_summary(frame: pl.DataFrame) -> dict | None:
    """``{"sessions", "turns", "turns_ok", "first_turn_hit_rate", "later_turn_hit_rate"}``
    over ``frame``'s session rows (the hit rates over turns that ended ok and whose
    cached tokens are known: cached / prompt tokens; None when there are none); None
    when it has no session."""
    if "session_id" not in frame.columns or frame["session_id"].null_count() == frame.height:
        return None
    turns = frame.filter(pl.col("session_id").is_not_null())
    ok = turns.filter((pl.col("status") == "ok") & pl.col("cached_tokens").is_not_null())

    def hit_rate(rows: pl.DataFrame) -> float | None:
        prompt = int(rows["prompt_tokens"].sum())
        return int(rows["cached_tokens"].sum()) / prompt if rows.height and prompt else None

    return {
        "sessions": turns["session_id"].n_unique(),
        "turns": turns.height,
        "turns_ok": int((turns["status"] == "ok").sum()),
        "first_turn_hit_rate": hit_rate(ok.filter(pl.col("turn") == 1)),
        "later_turn_hit_rate": hit_rate(ok.filter(pl.col("turn") > 1)),
    }


def session_line(summary: dict) -> str:
    """``12 sessions, 40 turns (40 ok); prefix cache hit rate: turns >= 2 88.8%, first
    turns 76.1%``."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    return (
        f"{summary['sessions']} sessions, {summary['turns']} turns ({summary['turns_ok']} ok); "
        f"prefix cache hit rate: turns >= 2 {pct(summary['later_turn_hit_rate'])}, "
        f"first turns {pct(summary['first_turn_hit_rate'])}"
    )
