"""Stalls of an external target, from what its client saw.

An external target (``--target``) has no engine records, so no ``stalls`` column of its
own. The client still timed every token: ``first_token_at`` (Unix s) and ``itl_s``, the
gaps between successive tokens in order (docs/loadgen.md). Token ``i + 1`` arrived at
``first_token_at + sum(itl_s[:i + 1])``, so gap ``i`` began at ``first_token_at +
sum(itl_s[:i])`` (the earlier token, as the engine's ``stalls[].start_s``) and lasted
``itl_s[i]``. The gaps above the threshold are cut by the records' own rule
(``harness.records.requests.add_stalls``), so a client stall is what an engine stall would be,
on the client's clock and including the network.
"""

from __future__ import annotations

from itertools import accumulate

import polars as pl

from harness.records.requests import REQUEST_SCHEMA, add_stalls


def token_gaps(
    first_token_at: float | None, itl_s: list[float] | None
) -> list[tuple[float, float]]:
    """(start_s, duration_s) of every inter-token gap of one request: its start the
    earlier token's arrival (``first_token_at`` plus the gaps before it)."""
    if first_token_at is None or not itl_s:
        return []
    starts = accumulate(itl_s[:-1], initial=first_token_at)
    return list(zip(starts, itl_s, strict=True))


def with_client_stalls(frame: pl.DataFrame, threshold_s: float) -> pl.DataFrame:
    """``frame`` (client rows) with ``stall_s``, ``num_stalls`` and ``stalls`` filled
    from its token times: every gap above ``threshold_s``, typed as the engine's."""
    n = frame.height
    firsts = frame["first_token_at"].to_list() if "first_token_at" in frame.columns else [None] * n
    itls = frame["itl_s"].to_list() if "itl_s" in frame.columns else [None] * n
    rows = [{"_long_gaps": token_gaps(f, i)} for f, i in zip(firsts, itls, strict=True)]
    add_stalls(rows, threshold_s)
    return frame.with_columns(
        pl.Series(name, [row[name] for row in rows], dtype=REQUEST_SCHEMA[name])
        for name in ("stall_s", "num_stalls", "stalls")
    )
