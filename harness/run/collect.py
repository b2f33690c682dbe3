"""A load cell's files from its raw records, after the load: requests.parquet (the
client rows joined with the engine's on one clock), steps and decisions on the clients'
clock, spans.parquet and summary.json; then which files are there and which are missing.
What cannot be made is a failure or a warning of the cell, never an exception."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl

from engine.core.token_timing import STALL_FLOOR_S
from harness.loadgen.clock import clock_warnings
from harness.report.errors import describe, error_summary, headline
from harness.report.stall_causes import CLIENT_TOKEN_TIMES, ENGINE_RECORDS
from harness.run.cell_result import CellResult, note_files
from harness.run.cell_telemetry import target_trace
from harness.run.client_stalls import with_client_stalls
from harness.run.clock_check import check_clocks
from harness.run.join import join_requests, shift_steps, write_spans
from harness.run.outcome import judge_load
from harness.run.session_summary import session_summary
from harness.run.settings import CellSettings
from harness.run.target_spans import SOURCE as TARGET_SPANS_SOURCE
from harness.run.target_spans import join_span_columns

#: Served records keep the gaps above the engine's stall floor: a served run has no
#: median ITL of its own to scale the threshold by (RequestRecorder.write).
SERVED_STALL_THRESHOLD_S = STALL_FLOOR_S


#: The files a load cell may leave, in the order run.json lists them.
LOAD_CELL_FILES = (
    "requests.parquet",
    "metrics.parquet",
    "steps.parquet",
    "spans.parquet",
    "decisions.parquet",
)


def collect(
    result: CellResult,
    settings: CellSettings,
    records: Path,
    raw: Path,
    epoch: float | None,
    info: dict,
    load_s: float,
) -> None:
    """After the load, the cell's files from the raw records: requests.parquet (the
    client rows joined with the engine's), steps and decisions on the clients' clock,
    spans.parquet and summary.json; then which files are there and which are missing.
    What cannot be made is a failure or a warning of the cell, never an exception.
    ``epoch``: the server's clock epoch (Unix s), if known."""
    client, loadgen = client_records(result, records, info)
    engine = None
    shift_s = 0.0
    if result.mode == "serve":
        engine = _engine_requests(result, raw)
        if epoch is None:
            epoch = loadgen.get("server_clock_epoch_unix")
        if client is not None and engine is not None and epoch is not None:
            shift_s = _check_clocks(result, client, engine, epoch, info)
            epoch += shift_s
    # spans first: a --target cell's requests take server columns from them
    spans = _write_spans(result, settings, raw, info, shift_s)
    open_rows = None
    if client is not None:
        open_rows = _write_requests(
            result, client, engine, epoch, info, settings.max_error_rate, spans
        )
    judge_load(result, loadgen, open_rows)
    _write_engine_records(result, raw, epoch)
    if client is not None:
        _write_cell_summary(result, settings, load_s, info.get("faults") or None)
    note_files(result, LOAD_CELL_FILES)
    if result.mode == "target":
        result.missing = [
            m for m in result.missing if m not in ("steps.parquet", "decisions.parquet")
        ]
        if info.get("server_columns_source"):  # queue_s and the engine_* from its spans
            result.missing.append(
                "engine records (steps, preemptions, stall causes): an external target "
                "has none (queue_s from its spans)"
            )
        else:
            result.missing.append(
                "engine records (steps, queue_s, preemptions, stall causes): an external "
                "target has none"
            )


def client_records(
    result: CellResult, records: Path, info: dict
) -> tuple[pl.DataFrame | None, dict]:
    """(Locust's client rows, the load generator's summary) from ``records``. Rows that
    cannot be merged are a ``merge`` failure (the rows read as they are, if they can be,
    else None); a generator-limited load is a failure of its own."""
    from harness.loadgen.merge import MergeError, merge_records, read_records
    from harness.loadgen.plan_check import failure_message

    try:
        loadgen = merge_records(records)
        client = pl.read_parquet(records / "requests.parquet")
    except (MergeError, OSError, ValueError) as exc:
        result.fail("merge", f"client records: {exc}")
        loadgen = {}
        try:
            client = read_records(records)
        except Exception:  # noqa: BLE001
            client = None
    info["loadgen"] = {k: v for k, v in loadgen.items() if k != "worker_summaries"}
    result.prompts = info["prompts"] = loadgen.get("prompts")
    result.generator_limited = loadgen.get("generator_limited")
    if result.generator_limited:
        result.fail(
            "generator_limited",
            f"generator-limited: p99 send lag {(loadgen.get('send_lag_p99_s') or 0) * 1e3:.1f} ms "
            f"(limit {(loadgen.get('lag_limit_s') or 0) * 1e3:.0f} ms), "
            f"{loadgen.get('in_flight_capped', 0)} requests waited for the in-flight cap: "
            "latencies include the generator's delay",
        )
    for lost in loadgen.get("lost_workers") or []:
        result.fail(
            "worker_lost",
            f"load-generator worker {lost['worker']} was lost mid-run: "
            f"{lost['missing_open']} of its {lost['num_open_requests']} scheduled open-loop "
            f"requests have no record ({lost['num_closed_loops']} closed loop(s) ended early)",
        )
    for failed in loadgen.get("failed_workers") or []:
        # A worker that ran another schedule or none: the cell did not measure the load
        # it asked for (harness/loadgen/plan_check.py).
        kind = "worker_plan_mismatch" if failed.get("plan_mismatch") else "worker_failed"
        result.fail(kind, failure_message(failed), infrastructure=True)
    result.warnings.extend(clock_warnings(loadgen.get("clock") or {}))
    return client, loadgen


def _check_clocks(
    result: CellResult, client: pl.DataFrame, engine: pl.DataFrame, epoch: float, info: dict
) -> float:
    """The seconds to add to the engine's instants so they agree with the client's
    (harness/run/clock_check.py); the check goes into run.json (``engine_clock``), a
    disagreement into the cell's warnings."""
    checked = check_clocks(client, engine, epoch)
    info["engine_clock"] = {"clock_epoch_unix": epoch, **checked.as_dict()}
    warning = checked.warning()
    if warning:
        result.warnings.append(warning)
    return checked.shift_s


def _engine_requests(result: CellResult, raw: Path) -> pl.DataFrame | None:
    """The server's own request rows; None (an ``engine_records`` failure) when it did
    not write them."""
    engine_file = raw / "engine_requests.parquet"
    if engine_file.is_file():
        return pl.read_parquet(engine_file)
    result.fail(
        "engine_records",
        f"{engine_file.name} was not written: no server-side "
        "columns (queue_s, preemptions, stalls ...)",
    )
    return None


def _write_requests(
    result: CellResult,
    client: pl.DataFrame,
    engine: pl.DataFrame | None,
    epoch: float | None,
    info: dict,
    max_error_rate: float | None,
    spans: pl.DataFrame | None = None,
) -> int:
    """requests.parquet: every client row, the engine's columns joined on one clock
    (a --target cell: its stalls from the client's token times, ``stall_source``, and
    the server columns its spans give, ``server_columns_source``); the status counts,
    why requests failed (an error rate over ``max_error_rate`` degrades the cell), and
    a warning for requests not ok. Returns the number of open-loop rows (rows short of
    the schedule are judged by ``harness.run.outcome.judge_load``)."""
    cell = result.cell
    frame = join_requests(client, engine, epoch, cell.policy, cell.name)
    if result.mode == "target":
        # No engine records: the stalls the client saw, cut by the served rule.
        frame = with_client_stalls(frame, SERVED_STALL_THRESHOLD_S)
        info["stall_source"] = CLIENT_TOKEN_TIMES
        if spans is not None:
            frame = _with_target_span_columns(frame, spans, info)
    elif engine is not None:
        info["stall_source"] = ENGINE_RECORDS
    frame.write_parquet(result.path / "requests.parquet")
    result.counts = dict(sorted(frame.group_by("status").len().iter_rows())) if frame.height else {}
    note_errors(result, frame, max_error_rate)
    result.sessions = session_summary(frame)
    failed = {k: v for k, v in result.counts.items() if k != "ok"}
    if failed:
        result.warnings.append(
            "requests not ok: " + ", ".join(f"{k} {v}" for k, v in failed.items())
        )
    open_rows = frame.filter(pl.col("phase_kind") == "open").height
    if result.scheduled is not None and open_rows > result.scheduled:
        result.warnings.append(
            f"{open_rows} open-loop rows for {result.scheduled} scheduled open-loop requests"
        )
    if engine is not None and epoch is not None:
        joined = frame["queue_s"].is_not_null().sum() if "queue_s" in frame.columns else 0
        info["engine_rows_joined"] = int(joined)
    return open_rows


def _with_target_span_columns(frame: pl.DataFrame, spans: pl.DataFrame, info: dict) -> pl.DataFrame:
    """``frame`` with the server columns the target's spans give (vLLM's
    ``llm_request``: harness/run/target_spans.py) and, when any request found its span,
    ``server_columns_source`` in the cell's run.json: where they came from, which
    columns, how many requests joined."""
    joined, matched = join_span_columns(frame, spans)
    if matched:
        info["server_columns_source"] = {
            "source": TARGET_SPANS_SOURCE,
            "columns": [c for c in joined.columns if c not in frame.columns],
            "requests_joined": matched,
            "requests": frame.height,
        }
    return joined


def note_errors(result: CellResult, frame: pl.DataFrame, limit: float | None) -> None:
    """The cell's failed requests grouped by message (``result.errors``); an error rate
    above ``limit`` is the cell's ``error_rate`` failure, naming the commonest error."""
    result.errors = errors = error_summary(frame)
    if limit is not None and errors["error_rate"] > limit:
        result.fail(
            "error_rate",
            f"{headline(result.cell.name, errors)}, over --max-error-rate {limit:g}; most "
            f"common: {describe(errors['top'][0])}",
        )


def _write_engine_records(result: CellResult, raw: Path, epoch: float | None) -> None:
    """steps.parquet and decisions.parquet from the server's files, shifted onto the
    clients' clock; neither without the server's clock epoch."""
    if epoch is None:
        return
    steps_file = raw / "engine_steps.parquet"
    if steps_file.is_file():
        shift_steps(pl.read_parquet(steps_file), epoch).write_parquet(result.path / "steps.parquet")
    decisions_file = raw / "engine_decisions.parquet"
    if decisions_file.is_file():  # on the clients' clock, as steps
        pl.read_parquet(decisions_file).with_columns(pl.col("time") + epoch).write_parquet(
            result.path / "decisions.parquet"
        )


def _write_spans(
    result: CellResult, settings: CellSettings, raw: Path, info: dict, shift_s: float = 0.0
) -> pl.DataFrame | None:
    """spans.parquet from the cell's trace file: the server's (served), the OTLP
    receivers' or --target-trace-file's (--target); the spans written, or None. A trace
    file that cannot be read degrades the cell; a missing one is a warning. ``shift_s``:
    seconds added to every instant (a served engine's clock correction)."""
    trace = raw / "spans.jsonl" if result.mode == "serve" else settings.target_trace_file
    receives = settings.target_otlp_port is not None or settings.target_otlp_grpc_port is not None
    if result.mode == "target" and receives:
        trace = target_trace(raw)
    if trace is not None and Path(trace).is_file():
        try:
            frame = write_spans(Path(trace), result.path / "spans.parquet", shift_s)
        except Exception as exc:  # noqa: BLE001 - keep the rest
            result.fail("spans", f"{trace}: {type(exc).__name__}: {exc}")
            return None
        info["spans"] = frame.height
        return frame
    if trace is not None:
        result.warnings.append(f"no trace file at {trace}: no spans.parquet")
    return None


def _write_cell_summary(
    result: CellResult, settings: CellSettings, load_s: float, faults: dict | None
) -> None:
    """The cell's summary.json (version 1, harness/records/summary.py) from its requests.parquet
    as written: the load's duration, the served records' stall threshold and, served,
    the engine config and the server's planted ``faults`` (None: none)."""
    from harness.records.requests import REQUEST_SCHEMA
    from harness.records.summary import policy_run_info, policy_summary, run_summary

    cell = result.cell
    frame = pl.read_parquet(result.path / "requests.parquet")
    # A --target cell has no server-side columns: the summary counts them as absent
    # (nulls), the file itself is left as it is.
    absent = [
        pl.lit(None, dtype=t).alias(c) for c, t in REQUEST_SCHEMA.items() if c not in frame.columns
    ]
    frame = frame.with_columns(absent) if absent else frame
    served = cell.config is not None and result.mode == "serve"
    extra = policy_run_info(
        duration_s=load_s,
        stall_threshold_s=SERVED_STALL_THRESHOLD_S,
        config=dataclasses.asdict(cell.config) if served and cell.config is not None else None,
        faults=faults,
    )
    summary = run_summary(
        result.mode,
        settings.profile_name,
        settings.seed,
        {cell.name: policy_summary(frame, load_s or 0.0, settings.profile, extra=extra)},
        machine=settings.machine,
    )
    (result.path / "summary.json").write_text(
        json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n"
    )
