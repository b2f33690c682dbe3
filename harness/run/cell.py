"""One cell of a run, end to end: served (start the engine, Locust, scrape, stop, join),
against a target (Locust and scrape only), or simulated. Each returns a
:class:`CellResult` and leaves its files in the cell directory, whatever failed."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from harness.profiles import Profile, build_plan
from harness.run.join import join_requests, shift_steps, write_spans
from harness.run.live import RecordsTail, figures_line
from harness.run.loadgen import LOCUST_OK_CODES, LocustRun, profile_file
from harness.run.matrix import Cell, knob_flags
from harness.run.scrape import MetricsScraper, export_prometheus
from harness.run.server import ServedEngine, ServerStartError

#: The engine's stall floor: served records keep gaps above it (harness/records.py).
SERVED_STALL_THRESHOLD_S = 0.25
#: Beyond the schedule's planned end and Locust's grace, a Locust run is cut after this.
LOCUST_SLACK_S = 120.0
#: After a --target cell's load, how long the OTLP receiver waits for the target's
#: batch exporter to send what it still holds (OTel's default schedule delay is 5 s).
OTLP_FLUSH_WAIT_S = 6.0


@dataclass
class CellResult:
    cell: Cell
    path: Path
    mode: str  # serve | target | simulate
    infrastructure_failure: bool = False
    failures: list[dict] = field(default_factory=list)  # {kind, message, log_tail?}
    warnings: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # status -> requests
    scheduled: int | None = None
    generator_limited: bool | None = None
    wall_s: float = 0.0
    files: list[str] = field(default_factory=list)

    def fail(
        self, kind: str, message: str, log_tail: str | None = None, infrastructure: bool = False
    ) -> None:
        entry = {"kind": kind, "message": message}
        if log_tail:
            entry["log_tail"] = log_tail
        self.failures.append(entry)
        self.infrastructure_failure |= infrastructure


@dataclass
class CellSettings:
    profile_name: str
    profile: Profile  # scaled by the cell's rate and the run's duration scale
    duration_scale: float
    seed: int | None
    executor: str = "torch"
    cost_model: Path | None = None
    torch_threads: int | None = None
    target: str | None = None
    target_trace_file: Path | None = None
    #: With --target: receive the target's spans over OTLP/HTTP on this port.
    target_otlp_port: int | None = None
    api_key: str | None = None
    prometheus: bool = False
    grace_s: float = 30.0
    locust_args: list[str] = field(default_factory=list)
    serve_args: list[str] = field(default_factory=list)
    start_timeout_s: float = 180.0


def planned(profile: Profile, seed: int | None) -> tuple[int, float]:
    """(open-loop requests scheduled, schedule duration in s)."""
    plan = build_plan(profile, seed)
    return plan.num_open_requests, plan.duration_s


def _cell_summary(
    cell: Cell, result: CellResult, frame: pl.DataFrame, settings: CellSettings, extra: dict
) -> dict:
    from harness.records import REQUEST_SCHEMA
    from harness.summary import SUMMARY_SCHEMA_VERSION, policy_summary

    # A --target cell has no server-side columns: the summary counts them as absent
    # (nulls), the file itself is left as it is.
    absent = [
        pl.lit(None, dtype=t).alias(c) for c, t in REQUEST_SCHEMA.items() if c not in frame.columns
    ]
    frame = frame.with_columns(absent) if absent else frame
    duration = extra.get("duration_s") or 0.0
    summary = policy_summary(frame, duration, settings.profile, extra=extra)
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "mode": result.mode,
        "profile": settings.profile_name,
        "seed": settings.seed,
        "policies": {cell.name: summary},
    }


def _note_files(result: CellResult, names: tuple[str, ...]) -> None:
    for name in names:
        if (result.path / name).is_file():
            result.files.append(name)
        else:
            result.missing.append(name)


def run_load_cell(
    cell: Cell, cell_dir: Path, settings: CellSettings, show: Callable[[str], None]
) -> CellResult:
    """A served cell (the bundled engine started here) or a --target cell."""
    mode = "target" if settings.target else "serve"
    result = CellResult(cell, cell_dir, mode)
    started = time.monotonic()
    raw = cell_dir / "raw"
    records = cell_dir / "locust"
    for d in (raw, records):
        d.mkdir(parents=True, exist_ok=True)
    scheduled, duration = planned(settings.profile, settings.seed)
    result.scheduled = scheduled
    server = None
    url = settings.target
    epoch = None
    info: dict = {"scheduled_requests": scheduled, "schedule_duration_s": duration}
    if mode == "serve":
        args = [
            "--executor",
            settings.executor,
            "--scheduling-policy",
            cell.policy,
            *knob_flags(cell.knobs),
            "--record-requests",
            str(raw / "engine_requests.parquet"),
            "--record-steps",
            str(raw / "engine_steps.parquet"),
            "--record-decisions",
            str(raw / "engine_decisions.parquet"),
            "--trace-file",
            str(raw / "spans.jsonl"),
        ]
        if settings.cost_model is not None:
            args += ["--cost-model", str(settings.cost_model)]
        if settings.torch_threads is not None:
            args += ["--torch-threads", str(settings.torch_threads)]
        args += settings.serve_args
        server = ServedEngine(args, cell_dir / "serve.log", settings.start_timeout_s)
        info["serve_command"] = server.command[1:]
        show(f"{cell.name}: starting schedscope serve ({settings.executor} executor)")
        try:
            url = server.start()
        except ServerStartError as exc:
            result.fail("server_start", str(exc), exc.log_tail, infrastructure=True)
            server.stop()
            info["server_exit_code"] = server.exit_code
            result.wall_s = time.monotonic() - started
            _note_files(result, ("requests.parquet",))
            return _finish(result, settings, info)
        epoch = server.health.get("clock_epoch_unix")
        info["url"] = url
        info["clock_epoch_unix"] = epoch
    else:
        info["url"] = url
    prom = None
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    scraper = MetricsScraper(url, headers=headers)
    load_start = time.time()
    if settings.prometheus:
        from harness.prometheus import PrometheusError, PrometheusServer

        host = url.split("://", 1)[-1].rstrip("/")
        try:
            prom = PrometheusServer(
                [host], scrape_interval_s=1.0, data_dir=cell_dir / "prometheus"
            ).__enter__()
            info["prometheus_url"] = prom.url
        except PrometheusError as exc:
            result.warnings.append(f"--prometheus: {exc}; scraping /metrics directly instead")
            prom = None
    if prom is None:
        scraper.start()
    receiver = None
    if result.mode == "target" and settings.target_otlp_port is not None:
        from harness.run.otlp_receiver import OtlpReceiver

        try:
            receiver = OtlpReceiver(
                raw / "target_spans.jsonl", settings.target_otlp_port
            ).__enter__()
            info["otlp_receiver"] = receiver.url
            show(f"{cell.name}: receiving the target's spans at {receiver.url}")
        except OSError as exc:
            result.warnings.append(f"--target-otlp-port: {exc}; no spans")
    locust = LocustRun(
        profile_file(settings.profile_name, cell_dir),
        url,
        records,
        cell_dir / "locust.log",
        cell.rate_scale,
        settings.duration_scale,
        settings.seed,
        extra=(["--api-key", settings.api_key] if settings.api_key else []) + settings.locust_args,
        grace_s=settings.grace_s,
    )
    info["locust_command"] = ["locust", *locust.args]
    locust.start()
    tail = RecordsTail(records)
    deadline = time.monotonic() + duration + settings.grace_s + LOCUST_SLACK_S
    locust_started = time.monotonic()
    while locust.poll() is None and time.monotonic() < deadline:
        time.sleep(1.0)
        tail.poll()
        latest = scraper.latest
        if prom is not None:
            latest = _prom_latest(prom)
        show(figures_line(cell.name, locust_started, tail, scheduled, latest))
    code = locust.wait(deadline)
    tail.poll()
    load_end = time.time()
    info["locust_exit_code"] = code
    if locust.timed_out:
        result.fail(
            "locust_timeout",
            f"Locust still running {duration + settings.grace_s + LOCUST_SLACK_S:.0f} s "
            "after its start: stopped",
            locust.log_tail(),
            infrastructure=True,
        )
    elif code not in LOCUST_OK_CODES:
        result.fail(
            "locust_crashed", f"Locust exited with {code}", locust.log_tail(), infrastructure=True
        )
    if receiver is not None:
        time.sleep(OTLP_FLUSH_WAIT_S)  # the target's batch exporter sends what it holds
        receiver.__exit__(None, None, None)
        info["otlp_spans_received"] = receiver.num_spans
    # metrics
    if prom is not None:
        try:
            frame = export_prometheus(prom, load_start - 1, time.time() + 1)
            frame.write_parquet(cell_dir / "metrics.parquet")
        except Exception as exc:  # noqa: BLE001 - keep the rest of the cell
            result.fail("prometheus_export", f"{type(exc).__name__}: {exc}")
        prom.__exit__(None, None, None)
    else:
        scraper.stop()
        scraper.write(cell_dir / "metrics.parquet")
        info["scrapes"] = scraper.scrapes
        if scraper.failures:
            result.warnings.append(
                f"{scraper.failures} of {scraper.scrapes + scraper.failures} "
                f"/metrics scrapes failed (last: {scraper.last_error})"
            )
    if server is not None:
        show(f"{cell.name}: stopping the server (SIGTERM; it drains and writes its records)")
        exit_code = server.stop()
        info["server_exit_code"] = exit_code
        if server.killed:
            result.fail(
                "server_stop",
                "the server did not exit after SIGTERM: killed (its record files may be missing)",
                server.log_tail(),
            )
        elif exit_code not in (0, None):
            result.fail("server_exit", f"the server exited with {exit_code}", server.log_tail())
    _collect(result, settings, records, raw, epoch, info, load_end - load_start)
    result.wall_s = time.monotonic() - started
    return _finish(result, settings, info)


def _prom_latest(prom) -> dict[str, float]:
    out = {}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        try:
            values = prom.query(f"sum({name})")
            if values:
                out[name] = float(values[0]["value"][1])
        except Exception:  # noqa: BLE001 - a live figure only
            pass
    return out


def _collect(
    result: CellResult,
    settings: CellSettings,
    records: Path,
    raw: Path,
    epoch: float | None,
    info: dict,
    load_s: float,
) -> None:
    from harness.loadgen.merge import MergeError, merge_records, read_records

    cell = result.cell
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
    result.generator_limited = loadgen.get("generator_limited")
    if result.generator_limited:
        result.fail(
            "generator_limited",
            f"generator-limited: p99 send lag {(loadgen.get('send_lag_p99_s') or 0) * 1e3:.1f} ms "
            f"(limit {(loadgen.get('lag_limit_s') or 0) * 1e3:.0f} ms), "
            f"{loadgen.get('in_flight_capped', 0)} requests waited for the in-flight cap: "
            "latencies include the generator's delay",
        )
    engine = None
    engine_file = raw / "engine_requests.parquet"
    if result.mode == "serve":
        if engine_file.is_file():
            engine = pl.read_parquet(engine_file)
        else:
            result.fail(
                "engine_records",
                f"{engine_file.name} was not written: no server-side "
                "columns (queue_s, preemptions, stalls ...)",
            )
        if epoch is None:
            epoch = loadgen.get("server_clock_epoch_unix")
    if client is not None:
        frame = join_requests(client, engine, epoch, cell.policy, cell.name)
        frame.write_parquet(result.path / "requests.parquet")
        result.counts = (
            dict(sorted(frame.group_by("status").len().iter_rows())) if frame.height else {}
        )
        failed = {k: v for k, v in result.counts.items() if k != "ok"}
        if failed:
            result.warnings.append(
                "requests not ok: " + ", ".join(f"{k} {v}" for k, v in failed.items())
            )
        if (
            result.scheduled is not None
            and frame.filter(pl.col("phase_kind") == "open").height != result.scheduled
        ):
            result.warnings.append(
                f"{frame.height} rows for {result.scheduled} scheduled open-loop requests"
            )
        if engine is not None and epoch is not None:
            joined = frame["queue_s"].is_not_null().sum() if "queue_s" in frame.columns else 0
            info["engine_rows_joined"] = int(joined)
    steps_file = raw / "engine_steps.parquet"
    if steps_file.is_file() and epoch is not None:
        shift_steps(pl.read_parquet(steps_file), epoch).write_parquet(result.path / "steps.parquet")
    decisions_file = raw / "engine_decisions.parquet"
    if decisions_file.is_file() and epoch is not None:  # on the clients' clock, as steps
        pl.read_parquet(decisions_file).with_columns(pl.col("time") + epoch).write_parquet(
            result.path / "decisions.parquet"
        )
    trace = raw / "spans.jsonl" if result.mode == "serve" else settings.target_trace_file
    if result.mode == "target" and settings.target_otlp_port is not None:
        trace = raw / "target_spans.jsonl"
    if trace is not None and Path(trace).is_file():
        try:
            info["spans"] = write_spans(Path(trace), result.path / "spans.parquet")
        except Exception as exc:  # noqa: BLE001 - keep the rest
            result.fail("spans", f"{trace}: {type(exc).__name__}: {exc}")
    elif trace is not None:
        result.warnings.append(f"no trace file at {trace}: no spans.parquet")
    if client is not None:
        frame = pl.read_parquet(result.path / "requests.parquet")
        extra = {"duration_s": load_s, "stall_threshold_s": SERVED_STALL_THRESHOLD_S}
        if cell.config is not None and result.mode == "serve":
            extra["config"] = dataclasses.asdict(cell.config)
        summary = _cell_summary(cell, result, frame, settings, extra)
        (result.path / "summary.json").write_text(
            json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n"
        )
    _note_files(
        result,
        (
            "requests.parquet",
            "metrics.parquet",
            "steps.parquet",
            "spans.parquet",
            "decisions.parquet",
        ),
    )
    if result.mode == "target":
        result.missing = [
            m for m in result.missing if m not in ("steps.parquet", "decisions.parquet")
        ]
        result.missing.append(
            "engine records (steps, queue_s, preemptions, stalls): an external target has none"
        )


def run_simulated_cell(
    cell: Cell, cell_dir: Path, settings: CellSettings, show: Callable[[str], None]
) -> CellResult:
    from engine.core.cost_model import CostModel
    from harness.simulate import run_simulations

    result = CellResult(cell, cell_dir, "simulate")
    started = time.monotonic()
    raw = cell_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    scheduled, duration = planned(settings.profile, settings.seed)
    result.scheduled = scheduled
    show(f"{cell.name}: simulating {scheduled} requests")
    model = CostModel.load(settings.cost_model) if settings.cost_model else CostModel()
    summary = run_simulations(
        settings.profile,
        {cell.name: cell.config},
        model,
        cell_dir,
        seed=settings.seed,
        trace_file=raw / "spans.jsonl",
    )
    frame = pl.read_parquet(cell_dir / "requests.parquet").with_columns(
        pl.lit(cell.name).alias("cell")
    )
    frame.write_parquet(cell_dir / "requests.parquet")
    # The report's profile and mode: this run's (the profile's file name, not its own name).
    summary["mode"] = "simulate"
    summary["profile"] = settings.profile_name
    (cell_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    result.counts = dict(sorted(frame.group_by("status").len().iter_rows())) if frame.height else {}
    result.generator_limited = False
    _note_files(result, ("requests.parquet", "steps.parquet", "spans.parquet", "decisions.parquet"))
    result.wall_s = time.monotonic() - started
    return _finish(
        result, settings, {"scheduled_requests": scheduled, "schedule_duration_s": duration}
    )


def _finish(result: CellResult, settings: CellSettings, info: dict) -> CellResult:
    """Write the cell's run.json."""
    from harness.run.versions import versions

    cell = result.cell
    body = {
        "cell": cell.name,
        "mode": result.mode,
        "policy": cell.policy,
        "knob_set": cell.knob_set,
        "rate_scale": cell.rate_scale,
        "duration_scale": settings.duration_scale,
        "profile": settings.profile_name,
        "seed": settings.seed,
        "target": settings.target,
        "executor": settings.executor if result.mode == "serve" else None,
        "knobs": cell.knobs,
        "config": dataclasses.asdict(cell.config) if cell.config is not None else None,
        "versions": versions(),
        "status": "failed"
        if result.infrastructure_failure
        else ("degraded" if result.failures else "ok"),
        "failures": result.failures,
        "warnings": result.warnings,
        "missing": result.missing,
        "counts": result.counts,
        "generator_limited": result.generator_limited,
        "wall_s": round(result.wall_s, 3),
        "files": result.files,
        **info,
    }
    (result.path / "run.json").write_text(json.dumps(body, indent=2, default=str) + "\n")
    return result


def remove_raw(cell_dir: Path) -> None:
    shutil.rmtree(cell_dir / "raw", ignore_errors=True)
