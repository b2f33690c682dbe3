"""Whether a cell's record files hold what the report reads, before anything is computed.

A file replaced by one of another schema, cut short, or holding impossible numbers must
not become a confident verdict: a ``requests.parquet`` without ``status`` reads as a
cell where nothing finished (goodput 0), and an infinite E2E turns every percentile
into NaN. So each cell's ``requests.parquet`` is checked here against what the report
needs (docs/records.md, docs/metrics.md):

- it opens as Parquet;
- it has the columns every writer of request records writes
  (:data:`REQUIRED_REQUEST_COLUMNS`), and every column the report reads has a type it
  can be read as (strings as strings, numbers as numbers: :data:`EXPECTED_KINDS`);
- every row has a known ``status`` and a finite ``scheduled_at``; no latency, duration,
  offset or count is negative, and none is NaN or infinite (:data:`NON_NEGATIVE`,
  :data:`FINITE`). Nulls are allowed: they mean "not measured".

A cell that fails is *broken*: the report names it with its problems and leaves it out
of every table, comparison and verdict, and goes on with the other cells
(``harness/report/inputs.py``). A problem in a row is the whole cell's: a recorder that
wrote one impossible latency is not trusted for the others, and dropping the row would
bias what is left (an infinite E2E is most likely a very slow request).

The optional files (spans, steps, decisions, metrics) are checked for what their
readers select (:data:`OPTIONAL_COLUMNS`); one that fails is treated as missing, with
the reason, since every section falls back without it.

:func:`bad_values` is shared with the gate (``harness/gate/sides.py``), which refuses
the same values in its per-request rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from harness.records.requests import STATUSES


def is_duration(value) -> bool:
    """Whether ``value`` is a duration in seconds: a finite number >= 0, not a bool (a
    summary's or a baseline's ``duration_s``, read by the report and the gate)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


#: Columns without which a requests.parquet is not request records at all: every writer
#: (the simulator, the load generator, the engine's --record-requests) writes them.
REQUIRED_REQUEST_COLUMNS = ("request_id", "status", "scheduled_at", "ttft_s", "e2e_s")

#: Seconds and counts that cannot be negative, NaN or infinite in any row.
NON_NEGATIVE = (
    "ttft_s",
    "ttft_from_sent_s",
    "tpot_s",
    "e2e_s",
    "max_itl_s",
    "queue_s",
    "total_queue_s",
    "swapped_s",
    "stall_s",
    "schedule_offset_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "preemptions",
    "preempt_swaps",
    "preempt_recomputes",
    "recomputed_tokens",
    "idle_running_steps",
    "cached_tokens",
    "evicted_prefix_tokens",
    "num_stalls",
    "phase",
    "slo_ttft_s",
    "slo_tpot_s",
    "slo_e2e_s",
)
#: Instants: any finite reading of their clock (the engine's may start anywhere).
FINITE = ("scheduled_at", "sent_at", "first_scheduled_at", "first_token_at", "finished_at")

STRING, NUMBER, NUMBER_LIST, STALL_LIST = "string", "number", "list of numbers", "stall list"
#: How each column the report reads must be typed, when present.
EXPECTED_KINDS = {
    **{
        c: STRING
        for c in ("request_id", "policy", "profile", "class", "status", "error", "session_id")
    },
    **{c: NUMBER for c in (*NON_NEGATIVE, *FINITE, "priority", "http_status", "turn")},
    "itl_s": NUMBER_LIST,
    "stalls": STALL_LIST,
}

#: What the report's readers select from each optional file (harness/report/stalls.py,
#: diagnosis.py, figures.py); a file without one of them is left out.
OPTIONAL_COLUMNS = {
    "spans": ("name", "request_id", "start", "end"),
    "steps": (
        "execute_end",
        "num_prefill_tokens",
        "num_decode_seqs",
        "num_idle_running",
        "num_running",
        "num_waiting",
        "num_swapped",
        "num_free_device_blocks",
        "num_device_blocks",
        "num_free_host_blocks",
    ),
    "decisions": ("kind", "request_id", "time"),
    "metrics": ("timestamp", "name", "value"),
}


def read_schema(path: Path) -> tuple[pl.Schema | None, str | None]:
    """(the file's schema, None), or (None, why it cannot be read as Parquet)."""
    try:
        return pl.scan_parquet(path, glob=False).collect_schema(), None
    except Exception as exc:  # polars raises several kinds for a bad file; all mean "unreadable"
        return None, f"not a readable Parquet file ({_first_line(exc)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _kind_fits(dtype: pl.DataType, kind: str) -> bool:
    if dtype == pl.Null:  # an all-null column: nothing measured
        return True
    if kind == STRING:
        return dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum)
    if kind == NUMBER:
        return dtype.is_numeric()
    if not isinstance(dtype, pl.List):
        return False
    inner = dtype.inner
    if kind == NUMBER_LIST:
        return inner == pl.Null or inner.is_numeric()
    if inner == pl.Null:
        return True
    return isinstance(inner, pl.Struct) and {"start_s", "duration_s"} <= {
        f.name for f in inner.fields
    }


def schema_problems(schema: pl.Schema) -> list[str]:
    """The requests.parquet columns that are missing or typed as something else."""
    problems = []
    missing = [c for c in REQUIRED_REQUEST_COLUMNS if c not in schema]
    if missing:
        problems.append(
            f"no {', '.join(missing)} column{'s' if len(missing) > 1 else ''} "
            f"(request records have {', '.join(REQUIRED_REQUEST_COLUMNS)}; docs/records.md)"
        )
    for name, kind in EXPECTED_KINDS.items():
        if name in schema and not _kind_fits(schema[name], kind):
            problems.append(f"{name} is {schema[name]}, not a {kind}")
    return problems


def _value_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
    return f"{value!r}" if isinstance(value, str) else f"{value:g}"


def bad_values(frame: pl.LazyFrame | pl.DataFrame, id_column: str = "request_id") -> list[str]:
    """One line per column of ``frame`` holding a value no request can have: a negative,
    NaN or infinite latency, duration, offset or count (:data:`NON_NEGATIVE`), a
    non-finite instant (:data:`FINITE`), a negative or non-finite gap in ``itl_s``.
    Each names the first such request, its value, and how many rows have one, e.g.
    ``request r7 has ttft_s -5 (1 such row)``. Only columns ``frame`` has are read."""
    lazy = frame.lazy()
    names = lazy.collect_schema().names()
    checks: list[tuple[str, pl.Expr, pl.Expr]] = []  # (column, bad row, its value)
    for column in (*NON_NEGATIVE, *FINITE):
        if column not in names:
            continue
        value = pl.col(column).cast(pl.Float64)
        bad = ~value.is_finite()
        if column in NON_NEGATIVE:
            bad = bad | (value < 0)
        checks.append((column, bad.fill_null(False), value))
    if "itl_s" in names:
        gaps = pl.col("itl_s").cast(pl.List(pl.Float64))
        bad = (
            gaps.list.eval((~pl.element().is_finite() | (pl.element() < 0)).fill_null(False))
            .list.any()
            .fill_null(False)
        )
        worst = gaps.list.eval(
            pl.element().filter(~pl.element().is_finite() | (pl.element() < 0))
        ).list.first()
        checks.append(("itl_s", bad, worst))
    if not checks:
        return []
    ids = pl.col(id_column).cast(pl.String) if id_column in names else pl.int_range(pl.len())
    exprs = []
    for n, (_, bad, value) in enumerate(checks):
        exprs += [
            bad.sum().alias(f"n{n}"),
            ids.filter(bad).first().cast(pl.String).alias(f"id{n}"),
            value.filter(bad).first().alias(f"v{n}"),
        ]
    row = lazy.select(exprs).collect().row(0, named=True)
    out = []
    for n, (column, _, _) in enumerate(checks):
        count = int(row[f"n{n}"] or 0)
        if count:
            shown = _value_text(row[f"v{n}"])
            what = f"a gap of {shown} in itl_s" if column == "itl_s" else f"{column} {shown}"
            rows = f"{count} such row{'s' if count > 1 else ''}"
            out.append(f"request {row[f'id{n}']} has {what} ({rows})")
    return out


def row_problems(lazy: pl.LazyFrame) -> list[str]:
    """Rows no request can have: an unknown or missing status, a missing arrival
    instant, and :func:`bad_values`."""
    problems = []
    status = pl.col("status").cast(pl.String)
    unknown = (~status.is_in(STATUSES)).fill_null(True)
    row = (
        lazy.select(
            unknown.sum().alias("n"),
            status.filter(unknown).first().alias("first"),
            pl.col("scheduled_at").null_count().alias("no_arrival"),
        )
        .collect()
        .row(0, named=True)
    )
    if row["n"]:
        problems.append(
            f"{row['n']} row(s) with a status that is not {'/'.join(STATUSES)} "
            f"(first: {_value_text(row['first'])})"
        )
    if row["no_arrival"]:
        problems.append(f"{row['no_arrival']} row(s) without scheduled_at")
    return problems + _turn_problems(lazy) + bad_values(lazy)


def _turn_problems(lazy: pl.LazyFrame) -> list[str]:
    """A session's row (``session_id`` set) without a turn number of 1 or more: the
    report's sessions section counts every turn by its number, so such a row could only
    be dropped from it."""
    names = lazy.collect_schema().names()
    if "session_id" not in names:
        return []
    turn = pl.col("turn").cast(pl.Float64) if "turn" in names else pl.lit(None, pl.Float64)
    bad = pl.col("session_id").is_not_null() & ~(turn >= 1).fill_null(False)
    ids = pl.col("request_id").cast(pl.String)
    row = (
        lazy.select(bad.sum().alias("n"), ids.filter(bad).first().alias("first"))
        .collect()
        .row(0, named=True)
    )
    if not row["n"]:
        return []
    return [
        f"{row['n']} session row(s) (session_id set) without a turn of 1 or more "
        f"(first: request {row['first']})"
    ]


def check_requests(path: Path) -> list[str]:
    """Everything wrong with the requests.parquet at ``path`` (module docstring); empty
    when the report can use it."""
    schema, unreadable = read_schema(path)
    if schema is None:
        return [str(unreadable)]
    problems = schema_problems(schema)
    if problems:  # the rows cannot be read as request records at all
        return problems
    try:
        return row_problems(pl.scan_parquet(path, glob=False))
    except Exception as exc:  # a file whose footer reads but whose pages do not
        return [f"not a readable Parquet file ({_first_line(exc)})"]


def check_optional(path: Path, name: str) -> str | None:
    """Why the optional record file ``name`` at ``path`` cannot be used; None when it can."""
    schema, unreadable = read_schema(path)
    if schema is None:
        return unreadable
    missing = [c for c in OPTIONAL_COLUMNS.get(name, ()) if c not in schema]
    if missing:
        return f"no {', '.join(missing)} column{'s' if len(missing) > 1 else ''}"
    return None
