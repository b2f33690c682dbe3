"""Why requests failed: a cell's error rate and its most common error messages.

A request **failed** when its status is not ``ok``, except the rows the end of the run
accounts for (``aborted`` with ``not sent: ...`` or ``in flight when the run stopped``:
docs/loadgen.md, "A run cut short"). The error rate is failed / rows.

Messages are grouped by their shape: the same text with its numbers replaced
(``Token id 2032 is out of vocabulary`` and ``Token id 2045 ...`` are one group), the
group shown by its first message, cut to :data:`MESSAGE_CHARS` characters, with its
count, the statuses and HTTP statuses it came with. Read by ``schedscope run`` (the
console, ``--max-error-rate``, each cell's run.json) and the report (report.md, html,
summary.json).
"""

from __future__ import annotations

import re

import polars as pl

#: An error rate above this is "high": the report says so before its verdicts and
#: diagnosis, and it is `schedscope run --max-error-rate`'s default.
HIGH_ERROR_RATE = 0.05
#: Error groups listed per cell.
TOP_ERRORS = 5
#: A message longer than this is cut (with "...").
MESSAGE_CHARS = 200
#: Aborted rows that are the end of the run's doing, not the server's failure.
_RUN_END = ("not sent:", "in flight when the run stopped")
_NUMBER = re.compile(r"\d+(\.\d+)?")


def cut(message: str, limit: int = MESSAGE_CHARS) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3].rstrip() + "..."


def failed_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows that count as failed requests (module docstring)."""
    error = pl.col("error").fill_null("")
    run_end = pl.any_horizontal([error.str.starts_with(p) for p in _RUN_END])
    return frame.filter((pl.col("status") != "ok") & ~((pl.col("status") == "aborted") & run_end))


def error_summary(frame: pl.DataFrame, top: int = TOP_ERRORS) -> dict:
    """``{"requests", "failed", "error_rate", "top": [{"message", "count", "statuses",
    "http_statuses"}]}`` of one cell's request rows, the largest groups first."""
    failed = failed_rows(frame)
    rows = frame.height
    groups: dict[str, dict] = {}
    http = failed["http_status"] if "http_status" in failed.columns else None
    for i, (status, error) in enumerate(failed.select("status", "error").iter_rows()):
        text = cut(error or "(no message)")
        key = _NUMBER.sub("#", text)
        g = groups.setdefault(
            key, {"message": text, "count": 0, "statuses": {}, "http_statuses": {}, "_texts": set()}
        )
        g["count"] += 1
        g["statuses"][status] = g["statuses"].get(status, 0) + 1
        code = http[i] if http is not None else None
        if code is not None:
            g["http_statuses"][str(code)] = g["http_statuses"].get(str(code), 0) + 1
        g["_texts"].add(text)
    ordered = sorted(groups.values(), key=lambda g: (-g["count"], g["message"]))
    listed = []
    for g in ordered[:top]:
        texts = g.pop("_texts")
        listed.append({**g, "numbers_vary": len(texts) > 1})
    return {
        "requests": rows,
        "failed": failed.height,
        "error_rate": round(failed.height / rows, 6) if rows else 0.0,
        "top": listed,
        "other_groups": max(0, len(ordered) - top),
    }


def describe(group: dict) -> str:
    """``169x error 400: Token id 2032 is out of vocabulary (numbers vary)``."""
    statuses = "/".join(sorted(group["statuses"]))
    codes = "/".join(sorted(group["http_statuses"]))
    vary = " (numbers vary)" if group.get("numbers_vary") else ""
    return f"{group['count']}x {statuses}{' ' + codes if codes else ''}: {group['message']}{vary}"


def headline(name: str, summary: dict) -> str:
    """``sjf: 169 of 170 requests failed (99.4%)``."""
    rate = summary["error_rate"] * 100
    return f"{name}: {summary['failed']} of {summary['requests']} requests failed ({rate:.1f}%)"


def lines(name: str, summary: dict) -> list[str]:
    """The headline, then one line per error group (nothing when none failed)."""
    if not summary["failed"]:
        return []
    out = [headline(name, summary)] + [f"  {describe(g)}" for g in summary["top"]]
    if summary.get("other_groups"):
        out.append(f"  ... and {summary['other_groups']} other kind(s) of error")
    return out
