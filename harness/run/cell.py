"""One cell of a run, end to end: served (start the engine, Locust, scrape, stop, join),
against a target (Locust and scrape only), or simulated. Each returns a
:class:`CellResult` and leaves its files in the cell directory, whatever failed.

A served or --target cell runs in named steps: start the server (:func:`_start_server`),
start the metrics source and the OTLP receiver (:func:`_start_metrics`,
:func:`_start_otlp_receiver`), run Locust (:func:`_run_locust`), stop them in reverse
order (:func:`_stop_metrics`, :func:`_stop_server`), then collect and join the records
(:func:`_collect`). Each resource goes onto an ExitStack as it starts, so that an
exception (Ctrl-C, a bug) stops whatever runs, the last started first, before it
propagates; the normal path closes the same scopes in the same order, recording what
each stop reports (exit codes, counts, failures) as it goes. Every stop is idempotent,
so where the normal path stops a resource itself the stack's later stop is a no-op.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from engine.core.token_timing import STALL_FLOOR_S
from harness.loadgen.clock import clock_warnings
from harness.loadgen.options import env_var
from harness.profiles import Profile, build_plan
from harness.records.redact import redact_argv, redact_url
from harness.report.errors import describe, error_summary, headline
from harness.report.stall_causes import CLIENT_TOKEN_TIMES, ENGINE_RECORDS
from harness.run.client_stalls import with_client_stalls
from harness.run.clock_check import check_clocks
from harness.run.join import join_requests, shift_steps, write_spans
from harness.run.live import RecordsTail, figures_line
from harness.run.loadgen import LOCUST_OK_CODES, LocustRun, profile_file
from harness.run.matrix import Cell
from harness.run.outcome import judge_load
from harness.run.outcome import status as cell_status
from harness.run.scrape import MetricsScraper, export_prometheus
from harness.run.server import ServedEngine, ServerStartError
from harness.run.target_spans import SOURCE as TARGET_SPANS_SOURCE
from harness.run.target_spans import join_span_columns
from harness.serve.knobs import knob_flags

if TYPE_CHECKING:
    from harness.run.otlp_receiver import SpanLines
    from harness.run.prometheus import PrometheusServer
    from harness.run.simulator_check import CheckModel

#: Served records keep the gaps above the engine's stall floor: a served run has no
#: median ITL of its own to scale the threshold by (RequestRecorder.write).
SERVED_STALL_THRESHOLD_S = STALL_FLOOR_S
#: Beyond the schedule's planned end and Locust's grace, a Locust run is cut after this.
LOCUST_SLACK_S = 120.0
#: After a --target cell's load, how long the OTLP receiver waits for the target's
#: batch exporter to send what it still holds (OTel's default schedule delay is 5 s).
OTLP_FLUSH_WAIT_S = 6.0
#: With --prometheus, how long the cell waits for a scrape after the load (it scrapes
#: every second) before exporting, so the counters' last samples hold the whole load.
LAST_SCRAPE_WAIT_S = 5.0
#: The files a load cell may leave, in the order run.json lists them.
LOAD_CELL_FILES = (
    "requests.parquet",
    "metrics.parquet",
    "steps.parquet",
    "spans.parquet",
    "decisions.parquet",
)


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
    #: why requests failed: harness.report.errors.error_summary of requests.parquet
    #: (None: no rows were read)
    errors: dict | None = None
    #: the prompts the load generator chose (harness/loadgen/prompt_choice.py), served
    #: or --target; None: not known
    prompts: dict | None = None

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
    #: With --target: receive the target's spans over OTLP/gRPC on this port.
    target_otlp_grpc_port: int | None = None
    api_key: str | None = None
    prometheus: bool = False
    grace_s: float = 30.0
    locust_args: list[str] = field(default_factory=list)
    #: ``--expect-workers``: seconds Locust's master may wait for its remote workers
    #: (added to the cell's Locust deadline).
    workers_wait_s: float = 0.0
    #: ``--expect-workers``: a TOML profile's locustfile holds the profile and its files
    #: (harness/profiles/bundle.py), for workers that lack them.
    ship_profile: bool = False
    serve_args: list[str] = field(default_factory=list)
    start_timeout_s: float = 180.0
    #: the fingerprint of the machine (harness/costmodel/machine.py), for run.json and summary.json
    machine: dict | None = None
    #: A served cell: the model its simulator check uses, chosen at the run's start
    #: (harness/run/simulator_check.py); None: no check.
    simulator_check: CheckModel | None = None
    #: An error rate above this degrades the cell (an ``error_rate`` failure, not
    #: infrastructure; the run then exits 3); None: no limit.
    max_error_rate: float | None = None


def planned(profile: Profile, seed: int | None) -> tuple[int, float]:
    """(open-loop requests scheduled, schedule duration in s)."""
    plan = build_plan(profile, seed)
    return plan.num_open_requests, plan.duration_s


def _note_files(result: CellResult, names: tuple[str, ...]) -> None:
    for name in names:
        if (result.path / name).is_file():
            result.files.append(name)
        else:
            result.missing.append(name)


@dataclass
class _LoadCell:
    """What the steps of one served or --target cell share: where its files go, what
    its schedule plans, and what it has recorded so far (``result``; ``info``, the
    run.json entries, in the order they were learnt)."""

    cell: Cell
    settings: CellSettings
    result: CellResult
    info: dict
    show: Callable[[str], None]
    scheduled: int
    duration_s: float  # the schedule's

    @property
    def cell_dir(self) -> Path:
        return self.result.path

    @property
    def raw(self) -> Path:  # the server's own record files and trace files
        return self.cell_dir / "raw"

    @property
    def records(self) -> Path:  # Locust's client records
        return self.cell_dir / "locust"


def run_load_cell(
    cell: Cell, cell_dir: Path, settings: CellSettings, show: Callable[[str], None]
) -> CellResult:
    """A served cell (the bundled engine started here) or a --target cell.

    Always returns the result with run.json written: a server that does not come up
    fails the cell (its log tail kept; the run goes on to the next cell), a Locust that
    crashes or hangs fails it but what was recorded is still collected. An exception
    (Ctrl-C) stops Locust, the OTLP receiver, the metrics source and the server, in
    that order, and propagates, leaving no run.json.
    """
    started = time.monotonic()
    scheduled, duration = planned(settings.profile, settings.seed)
    run = _LoadCell(
        cell,
        settings,
        CellResult(cell, cell_dir, "target" if settings.target else "serve"),
        {"scheduled_requests": scheduled, "schedule_duration_s": duration},
        show,
        scheduled,
        duration,
    )
    run.result.scheduled = scheduled
    for d in (run.raw, run.records):
        d.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        server = None
        url = settings.target
        if run.result.mode == "serve":
            server = _start_server(stack, run)
            if server is None:  # recorded as the cell's failure; already stopped
                run.result.wall_s = time.monotonic() - started
                _note_files(run.result, ("requests.parquet",))
                return _finish(run.result, settings, run.info)
            url = server.url
        else:
            run.info["url"] = redact_url(url)
        load_s = _run_load(run, url)
        if server is not None:
            _stop_server(server, run)
    epoch = server.health.get("clock_epoch_unix") if server is not None else None
    _collect(run.result, settings, run.records, run.raw, epoch, run.info, load_s)
    if run.result.mode == "serve":
        _check_simulator(run)
    run.result.wall_s = time.monotonic() - started
    return _finish(run.result, settings, run.info)


def _check_simulator(run: _LoadCell) -> None:
    """The served cell's schedule simulated with the model chosen at the run's start,
    then (only then: the check stays out of sample) the cell's steps fitted into the
    store. Whatever goes wrong is a warning of the cell, never its failure."""
    from harness.run import simulator_check

    check = run.settings.simulator_check
    if check is None:
        return
    settings = run.settings
    try:
        run.info[simulator_check.RUN_JSON_KEY] = simulator_check.simulate_counterpart(
            run.cell, settings.profile, settings.seed, check, run.cell_dir, run.show
        )
    except Exception as exc:  # noqa: BLE001 - the served records stand without it
        run.result.warnings.append(f"simulator check: {type(exc).__name__}: {exc}")
    try:
        run.info["cost_fit"] = simulator_check.fit_into_store(
            run.cell, check, run.cell_dir, run.show, faults=run.info.get("faults")
        )
    except Exception as exc:  # noqa: BLE001 - as above
        run.result.warnings.append(f"cost model fit: {type(exc).__name__}: {exc}")


def _serve_args(cell: Cell, settings: CellSettings, raw: Path) -> list[str]:
    """``schedscope serve`` arguments of a served cell: its policy and knobs, its record
    and trace files under ``raw``, then the run's cost model, torch threads and own
    serve arguments."""
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
    elif settings.executor == "sim":
        # the run chose the built-in (and said so): serve must not choose for itself
        args += ["--cost-model", "builtin"]
    if settings.torch_threads is not None:
        args += ["--torch-threads", str(settings.torch_threads)]
    return args + settings.serve_args


def _start_server(stack: ExitStack, run: _LoadCell) -> ServedEngine | None:
    """Start ``schedscope serve`` and wait until it is healthy. Its stop goes on
    ``stack`` before it starts, so an interrupted start stops it too.

    Returns the healthy server (its URL and clock epoch in ``run.info``), or None when
    it did not come up: the cell's infrastructure failure (with the log tail) and the
    server's exit code are then recorded, and the server is already stopped.
    """
    settings = run.settings
    server = ServedEngine(
        _serve_args(run.cell, settings, run.raw),
        run.cell_dir / "serve.log",
        settings.start_timeout_s,
    )
    stack.callback(server.stop)
    run.info["serve_command"] = server.command[1:]
    run.show(f"{run.cell.name}: starting schedscope serve ({settings.executor} executor)")
    try:
        url = server.start()
    except ServerStartError as exc:
        run.result.fail("server_start", str(exc), exc.log_tail, infrastructure=True)
        server.stop()
        run.info["server_exit_code"] = server.exit_code
        return None
    run.info["url"] = url
    run.info["clock_epoch_unix"] = server.health.get("clock_epoch_unix")
    run.info["faults"] = server.health.get("faults", {})
    return server


def _run_load(run: _LoadCell, url: str) -> float:
    """The load against ``url`` with its telemetry around it: start the metrics source
    and the OTLP receiver, run Locust, then stop the receiver (after the target's flush
    wait) and the metrics source (metrics.parquet written), in that order.

    Returns the load's wall seconds, from just before the metrics source started to
    Locust's end: the duration the cell's summary divides by.
    """
    load_start = time.time()
    with ExitStack() as metrics_scope:
        metrics = _start_metrics(metrics_scope, run, url)
        with ExitStack() as load_scope:
            receiver = _start_otlp_receiver(load_scope, run)
            load_end = _run_locust(load_scope, run, url, metrics)
            if receiver is not None:
                time.sleep(OTLP_FLUSH_WAIT_S)  # the target's batch exporter sends what it holds
        # The receivers stopped with load_scope: every span they got is in the file.
        if receiver is not None:
            run.info["otlp_spans_received"] = receiver.num_spans
        # Exported while a real Prometheus still runs; it stops with metrics_scope.
        _stop_metrics(metrics, run, load_start)
    return load_end - load_start


@dataclass
class _Metrics:
    """A cell's metrics source: a real Prometheus (``prom``, with --prometheus) or the
    /metrics ``scraper``. Both feed the live view and end in metrics.parquet."""

    scraper: MetricsScraper
    prom: PrometheusServer | None = None

    def latest(self) -> dict[str, float]:
        """The live view's queue depths, from whichever source runs."""
        return _prom_latest(self.prom) if self.prom is not None else self.scraper.latest


def _start_metrics(stack: ExitStack, run: _LoadCell, url: str) -> _Metrics:
    """Start the metrics source of the cell, its stop on ``stack``: with --prometheus a
    real Prometheus scraping ``url``, falling back (with a warning) to the /metrics
    scraper when it cannot start; else the scraper."""
    settings = run.settings
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    metrics = _Metrics(MetricsScraper(url, headers=headers))
    if settings.prometheus:
        metrics.prom = _start_prometheus(stack, run, url)
    if metrics.prom is None:
        metrics.scraper.start()
        stack.callback(metrics.scraper.stop)
    return metrics


def _start_prometheus(stack: ExitStack, run: _LoadCell, url: str) -> PrometheusServer | None:
    """A real Prometheus scraping ``url`` every second, on ``stack``; None (with the
    cell's warning) when it cannot start."""
    from harness.run.prometheus import PrometheusError, PrometheusServer

    host = url.split("://", 1)[-1].rstrip("/")
    try:
        prom = stack.enter_context(
            PrometheusServer([host], scrape_interval_s=1.0, data_dir=run.cell_dir / "prometheus")
        )
    except PrometheusError as exc:
        run.result.warnings.append(f"--prometheus: {exc}; scraping /metrics directly instead")
        return None
    run.info["prometheus_url"] = prom.url
    return prom


def _start_otlp_receiver(stack: ExitStack, run: _LoadCell) -> SpanLines | None:
    """For a --target cell with --target-otlp-port and/or --target-otlp-grpc-port:
    receive the target's spans (OTLP/HTTP, OTLP/gRPC or both, into one trace file,
    raw/target_spans.jsonl) until ``stack`` closes. Returns the trace file's writer
    (its span count), or None for any other cell or (each with the cell's warning) when
    no port can be served."""
    settings = run.settings
    http_port, grpc_port = settings.target_otlp_port, settings.target_otlp_grpc_port
    if run.result.mode != "target" or (http_port is None and grpc_port is None):
        return None
    from harness.run.otlp_receiver import OtlpReceiver, SpanLines

    lines = stack.enter_context(SpanLines(_target_trace(run.raw)))
    receiving = False
    if http_port is not None:
        try:
            receiver = stack.enter_context(OtlpReceiver(lines, http_port))
        except OSError as exc:
            run.result.warnings.append(f"--target-otlp-port: {exc}; no spans over OTLP/HTTP")
        else:
            receiving = True
            run.info["otlp_receiver"] = receiver.url
            run.show(f"{run.cell.name}: receiving the target's spans at {receiver.url}")
    if grpc_port is not None:
        from harness.run.otlp_grpc_receiver import OtlpGrpcReceiver

        try:
            grpc_receiver = stack.enter_context(OtlpGrpcReceiver(lines, grpc_port))
        except OSError as exc:
            run.result.warnings.append(f"--target-otlp-grpc-port: {exc}; no spans over OTLP/gRPC")
        else:
            receiving = True
            run.info["otlp_grpc_receiver"] = grpc_receiver.url
            run.show(
                f"{run.cell.name}: receiving the target's spans over OTLP/gRPC at "
                f"{grpc_receiver.url}"
            )
    return lines if receiving else None


def _target_trace(raw: Path) -> Path:
    """The trace file a --target cell's OTLP receivers write."""
    return raw / "target_spans.jsonl"


def _run_locust(stack: ExitStack, run: _LoadCell, url: str, metrics: _Metrics) -> float:
    """Run Locust against ``url`` until it exits or its deadline passes (the schedule,
    the grace, then LOCUST_SLACK_S), showing live figures every second; a Locust still
    running at an exception is stopped by ``stack``. Records its exit code; a hung or
    crashed Locust is the cell's infrastructure failure. Returns when it ended (Unix s).
    """
    cell, settings = run.cell, run.settings
    locust = LocustRun(
        profile_file(settings.profile_name, run.cell_dir, ship=settings.ship_profile),
        url,
        run.records,
        run.cell_dir / "locust.log",
        cell.rate_scale,
        settings.duration_scale,
        settings.seed,
        extra=settings.locust_args,
        grace_s=settings.grace_s,
        secrets={env_var("--api-key"): settings.api_key} if settings.api_key else None,
    )
    run.info["locust_command"] = redact_argv(["locust", *locust.args])
    locust.start()
    stack.callback(locust.stop)
    tail = RecordsTail(run.records)
    limit_s = run.duration_s + settings.grace_s + LOCUST_SLACK_S + settings.workers_wait_s
    deadline = time.monotonic() + limit_s
    locust_started = time.monotonic()
    while locust.poll() is None and time.monotonic() < deadline:
        time.sleep(1.0)
        tail.poll()
        run.show(figures_line(cell.name, locust_started, tail, run.scheduled, metrics.latest()))
    code = locust.wait(deadline)
    tail.poll()
    load_end = time.time()
    run.info["locust_exit_code"] = code
    if locust.timed_out:
        run.result.fail(
            "locust_timeout",
            f"Locust still running {limit_s:.0f} s after its start: stopped",
            locust.log_tail(),
            infrastructure=True,
        )
    elif code not in LOCUST_OK_CODES:
        run.result.fail(
            "locust_crashed", f"Locust exited with {code}", locust.log_tail(), infrastructure=True
        )
    return load_end


def _stop_metrics(metrics: _Metrics, run: _LoadCell, load_start: float) -> None:
    """metrics.parquet of the load: Prometheus' series from ``load_start`` on (exported
    while it still runs, once it has scraped after the load; a failed export degrades
    the cell), else the scraper's rows once it has stopped (its last scrape after the
    load), with its scrape count and failures."""
    path = run.cell_dir / "metrics.parquet"
    if metrics.prom is not None:
        if not metrics.prom.wait_for_scrape(time.time(), LAST_SCRAPE_WAIT_S):
            run.result.warnings.append(
                "Prometheus did not scrape the target after the load within "
                f"{LAST_SCRAPE_WAIT_S:g} s: metrics.parquet may miss the load's last second"
            )
        try:
            frame = export_prometheus(metrics.prom, load_start - 1, time.time() + 1)
            frame.write_parquet(path)
        except Exception as exc:  # noqa: BLE001 - keep the rest of the cell
            run.result.fail("prometheus_export", f"{type(exc).__name__}: {exc}")
        return
    scraper = metrics.scraper
    scraper.stop()
    scraper.write(path)
    run.info["scrapes"] = scraper.scrapes
    if scraper.failures:
        run.result.warnings.append(
            f"{scraper.failures} of {scraper.scrapes + scraper.failures} "
            f"/metrics scrapes failed (last: {scraper.last_error})"
        )


def _stop_server(server: ServedEngine, run: _LoadCell) -> None:
    """Stop the server (SIGTERM: it drains and writes its record files) and record its
    exit code; a kill after the stop timeout or a non-zero exit degrades the cell."""
    run.show(f"{run.cell.name}: stopping the server (SIGTERM; it drains and writes its records)")
    exit_code = server.stop()
    run.info["server_exit_code"] = exit_code
    if server.killed:
        run.result.fail(
            "server_stop",
            "the server did not exit after SIGTERM: killed (its record files may be missing)",
            server.log_tail(),
        )
    elif exit_code not in (0, None):
        run.result.fail("server_exit", f"the server exited with {exit_code}", server.log_tail())


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
    """After the load, the cell's files from the raw records: requests.parquet (the
    client rows joined with the engine's), steps and decisions on the clients' clock,
    spans.parquet and summary.json; then which files are there and which are missing.
    What cannot be made is a failure or a warning of the cell, never an exception.
    ``epoch``: the server's clock epoch (Unix s), if known."""
    client, loadgen = _client_records(result, records, info)
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
    _note_files(result, LOAD_CELL_FILES)
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


def _client_records(
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
    _note_errors(result, frame, max_error_rate)
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


def _note_errors(result: CellResult, frame: pl.DataFrame, limit: float | None) -> None:
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
        trace = _target_trace(raw)
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
    served_config = cell.config is not None and result.mode == "serve"
    extra = policy_run_info(
        duration_s=load_s,
        stall_threshold_s=SERVED_STALL_THRESHOLD_S,
        config=dataclasses.asdict(cell.config) if served_config else None,
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


def run_simulated_cell(
    cell: Cell, cell_dir: Path, settings: CellSettings, show: Callable[[str], None]
) -> CellResult:
    from engine.core.cost_model import CostModel
    from harness.simulate.driver import run_simulations

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
        machine=settings.machine,
        speed_band=True,
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
    _note_errors(result, frame, settings.max_error_rate)
    judge_load(result, {}, None)
    result.generator_limited = False
    _note_files(result, ("requests.parquet", "steps.parquet", "spans.parquet", "decisions.parquet"))
    result.wall_s = time.monotonic() - started
    info = {
        "scheduled_requests": scheduled,
        "schedule_duration_s": duration,
        "faults": summary["policies"][cell.name].get("faults", {}),
    }
    return _finish(result, settings, info)


def _finish(result: CellResult, settings: CellSettings, info: dict) -> CellResult:
    """Write the cell's run.json."""
    from harness.run.versions import versions

    cell = result.cell
    body = {
        "cell": cell.name,
        "mode": result.mode,
        "policy": cell.policy,
        "knob_set": cell.knob_set,
        "repeat": cell.repeat,
        "rate_scale": cell.rate_scale,
        "duration_scale": settings.duration_scale,
        "profile": settings.profile_name,
        "seed": settings.seed,
        "target": redact_url(settings.target) if settings.target else None,
        "executor": settings.executor if result.mode == "serve" else None,
        "torch_threads": settings.torch_threads if result.mode == "serve" else None,
        "settings": cell.settings,
        # the file the served sim executor slept or the simulation used (None: built-in)
        "cost_model": str(settings.cost_model) if settings.cost_model is not None else None,
        "knobs": cell.knobs,
        "config": dataclasses.asdict(cell.config) if cell.config is not None else None,
        "versions": versions(),
        "machine": settings.machine,
        "status": cell_status(result),
        "failures": result.failures,
        "warnings": result.warnings,
        "missing": result.missing,
        "counts": result.counts,
        "errors": result.errors,
        "generator_limited": result.generator_limited,
        "wall_s": round(result.wall_s, 3),
        "files": result.files,
        **info,
    }
    (result.path / "run.json").write_text(json.dumps(body, indent=2, default=str) + "\n")
    return result


def remove_raw(cell_dir: Path) -> None:
    shutil.rmtree(cell_dir / "raw", ignore_errors=True)
