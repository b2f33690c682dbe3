"""Merge a records directory into ``requests.parquet`` and ``summary.json``.

``merge_records(records_dir, out_dir=None, run_id=None)`` reads every
``client-*.jsonl`` (one per Locust process) and ``summary-*.json`` of the directory,
checks that they are one run (one ``run_id``, no request id twice; pass ``run_id`` to
pick one run out of a directory that holds several) and writes:

- ``requests.parquet``: one row per scheduled request, ordered by ``scheduled_at``,
  with the client-side columns of docs/metrics.md (``records.RECORD_COLUMNS``; ``itl_s`` a
  list of float64);
- ``summary.json``: the run's counts by status, send lag percentiles over the
  open-loop rows, ``generator_limited`` (p99 lag over the limit, or any request that
  waited for the in-flight cap), the requests the end of the run cut in flight
  (``cut_in_flight``) or left unsent (``not_sent``), the requests sent again on a fresh
  connection (``retried``), the prompts chosen (``prompts``), the workers' summaries,
  the workers lost mid-run (``lost_workers``) and those that did not run their share
  (``failed_workers``: a plan not the master's, a run that could not start;
  ``harness.loadgen.plan_check``), the server's clock epoch, and, for a distributed run,
  the master's ``workers.json``: ``workers_expected`` (the workers it was told to wait
  for), ``workers_started`` (those it gave a share), ``workers_connected``,
  ``refused_messages`` (messages it ignored: not from a worker of the run, or not of the
  form one sends) and ``rows_refused`` (forwarded rows it did not write); each null
  without that file (one process).

Command line: ``python -m harness.loadgen.merge RECORDS_DIR [--out DIR] [--run-id ID]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl

from harness.loadgen.plan_check import failure_message
from harness.loadgen.records import RECORD_KINDS, SCHEDULED_KINDS
from harness.loadgen.row_types import checker
from harness.records.percentiles import percentile
from harness.records.send_lag import LAG_LIMIT_S

#: The Polars type of each record kind (records.RECORD_KINDS).
_POLARS_TYPES: dict[str, pl.DataType] = {
    "str": pl.String(),
    "int": pl.Int64(),
    "float": pl.Float64(),
    "bool": pl.Boolean(),
    "floats": pl.List(pl.Float64),
}
SCHEMA: dict[str, pl.DataType] = {c: _POLARS_TYPES[k] for c, k in RECORD_KINDS.items()}


class MergeError(Exception):
    pass


def read_records(records_dir: str | Path, run_id: str | None = None) -> pl.DataFrame:
    """Every row of the directory's ``client-*.jsonl`` files as one frame (SCHEMA). A
    value that does not fit its column is null and its row an ``error`` naming it
    (harness/loadgen/row_types.py): one bad row does not fail the merge."""
    conform = checker(RECORD_KINDS)
    rows = []
    for path in sorted(Path(records_dir).glob("client-*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:  # a process killed mid-line: say where
                    raise MergeError(f"{path}:{n}: not a JSON row ({e})") from e
                if not isinstance(row, dict):
                    raise MergeError(f"{path}:{n}: not a JSON row (a {type(row).__name__})")
                if run_id is None or row.get("run_id") == run_id:
                    rows.append(conform(row))
    frame = pl.DataFrame(rows, schema=SCHEMA) if rows else pl.DataFrame(schema=SCHEMA)
    return frame.sort("scheduled_at", "request_id")


def _workers_file(records_dir: Path, run_id: str | None) -> dict:
    """The master's ``workers.json`` of this run (``{}``: none, or another run's; a master
    that gave up waiting for its workers started no run: its ``run_id`` is null, as the
    summary's of a directory with no row)."""
    path = records_dir / "workers.json"
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(facts, dict) or facts.get("run_id") != run_id:
        return {}
    return facts


def merge_records(
    records_dir: str | Path,
    out_dir: str | Path | None = None,
    run_id: str | None = None,
    lag_limit_s: float | None = None,
) -> dict:
    """Write ``requests.parquet`` and ``summary.json`` to ``out_dir`` (default: the
    records directory) and return the summary."""
    records_dir = Path(records_dir)
    out = Path(out_dir) if out_dir is not None else records_dir
    frame = read_records(records_dir, run_id)
    runs = sorted(set(frame["run_id"].drop_nulls().to_list()))
    if len(runs) > 1:
        raise MergeError(
            f"{records_dir} holds {len(runs)} runs ({', '.join(runs)}): "
            "pass run_id (--run-id) or use one directory per run"
        )
    duplicates = frame.filter(pl.col("request_id").is_duplicated())["request_id"].unique()
    if len(duplicates):
        raise MergeError(f"request ids recorded twice: {duplicates.head(5).to_list()}")
    workers = []
    for path in sorted(records_dir.glob("summary-*.json")):
        s = json.loads(path.read_text())
        if not runs or s.get("run_id") == runs[0]:
            workers.append(s)
    lost = [json.loads(path.read_text()) for path in sorted(records_dir.glob("lost-*.json"))]
    lost = [w for w in lost if not runs or w.get("run_id") == runs[0]]
    failed = [{k: v for k, v in w.items() if k != "options"} for w in workers if w.get("error")]
    master = _workers_file(records_dir, runs[0] if runs else None)
    if lag_limit_s is None:
        lag_limit_s = next((w["lag_limit_s"] for w in workers if "lag_limit_s" in w), LAG_LIMIT_S)
    lags = frame.filter(pl.col("phase_kind").is_in(SCHEDULED_KINDS))["send_lag_s"].drop_nulls()
    p99 = percentile(lags.to_numpy(), 99)
    capped = int(frame["in_flight_capped"].sum()) if len(frame) else 0
    counts = dict(frame.group_by("status").len().iter_rows()) if len(frame) else {}
    epochs = {w.get("server_clock_epoch_unix") for w in workers} - {None}
    summary = {
        "run_id": runs[0] if runs else None,
        "profile": frame["profile"][0] if len(frame) else None,
        "rows": len(frame),
        "status_counts": counts,
        "workers": len(workers),
        "run_start_unix": min(
            (w["run_start_unix"] for w in workers if w.get("run_start_unix")), default=None
        ),
        "server_clock_epoch_unix": min(epochs) if epochs else None,
        "send_lag_p50_s": percentile(lags.to_numpy(), 50),
        "send_lag_p99_s": p99,
        "send_lag_max_s": lags.max() if len(lags) else None,
        "lag_limit_s": lag_limit_s,
        "in_flight_capped": capped,
        "generator_limited": bool((p99 is not None and p99 > lag_limit_s) or capped > 0),
        "probe_requests": sum(w.get("probe_requests", 0) for w in workers),
        "retried": int(frame["retried"].sum()) if len(frame) else 0,
        # every process probes the same server: the first one's choice stands for all
        "prompts": next((w["prompts"] for w in workers if w.get("prompts")), None),
        "clock": {
            str(w["worker"]): {
                "offset_s": w["clock_offset_s"],
                "uncertainty_s": w.get("clock_uncertainty_s"),
            }
            for w in [*workers, *lost]
            if w.get("clock_offset_s") is not None
        },
        "lost_workers": lost,
        "failed_workers": failed,
        "missing_open": sum(w.get("missing_open", 0) for w in [*lost, *failed]),
        "cut_in_flight": sum(w.get("cut_in_flight", 0) for w in workers),
        "not_sent": sum(w.get("not_sent", 0) for w in workers),
        "worker_summaries": workers,
        "workers_expected": master.get("expected"),
        "workers_started": master.get("started"),
        "workers_connected": master.get("connected"),
        "refused_messages": master.get("refused_messages"),
        "rows_refused": master.get("rows_refused"),
    }
    out.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out / "requests.parquet")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records_dir")
    parser.add_argument("--out", default=None)
    parser.add_argument("--run-id", default=None)
    args = parser.parse_args(argv)
    s = merge_records(args.records_dir, args.out, args.run_id)
    print(
        f"{s['rows']} rows {s['status_counts']} from {s['workers']} process(es); "
        f"p99 send lag {(s['send_lag_p99_s'] or 0) * 1e3:.2f} ms; "
        f"generator_limited: {str(s['generator_limited']).lower()}"
    )
    for lost in s["lost_workers"]:
        print(
            f"WARNING: worker {lost['worker']} was lost: {lost['missing_open']} of its "
            f"{lost['num_open_requests']} scheduled open-loop requests have no record"
        )
    for failed in s["failed_workers"]:
        print(f"WARNING: {failure_message(failed)}")
    expected, started = s["workers_expected"], s["workers_started"]
    if expected is not None and (started or 0) < expected:
        print(f"WARNING: {started or 0} of the {expected} expected load-generator workers started")
    if s["refused_messages"] or s["rows_refused"]:
        print(
            f"WARNING: the master ignored {s['refused_messages'] or 0} message(s) and refused "
            f"{s['rows_refused'] or 0} row(s) (workers.json)"
        )
    if s["generator_limited"]:
        print("WARNING: generator-limited run: latencies include the generator's delay")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
