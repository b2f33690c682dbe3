"""A served cell (the bundled engine started here) or a --target cell, end to end,
in named steps: start the server (:func:`_start_server`), start the metrics source and
the OTLP receiver (harness/run/cell_telemetry.py), run Locust (:func:`_run_locust`),
stop them in reverse order, stop the server (:func:`_stop_server`), then collect and
join the records (harness/run/collect.py) and check the simulator against the cell.

Each resource goes onto an ExitStack as it starts, so that an exception (Ctrl-C, a
bug) stops whatever runs, the last started first, before it propagates; the normal path
closes the same scopes in the same order, recording what each stop reports (exit codes,
counts, failures) as it goes. Every stop is idempotent, so where the normal path stops
a resource itself the stack's later stop is a no-op.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

from harness.costmodel.target_identity import TARGET_INFO_KEY, TARGET_KNOBS_KEY
from harness.loadgen.options import GRACE_S, env_var
from harness.processes.cpu_split import load_generator_cores
from harness.records.redact import redact_argv, redact_url
from harness.run.cell_result import CellResult, LoadCell, Show, note_files, write_cell_info
from harness.run.cell_telemetry import (
    MetricsSource,
    start_metrics,
    start_otlp_receiver,
    stop_metrics,
)
from harness.run.collect import collect
from harness.run.live import RecordsTail, figures_line
from harness.run.loadgen import LOCUST_OK_CODES, LocustRun, profile_file
from harness.run.matrix import Cell
from harness.run.server import ServedEngine, ServerStartError
from harness.run.settings import CellSettings
from harness.run.target_info import read_target_info
from harness.serve.knobs import knob_flags

#: Beyond the schedule's planned end and Locust's grace, a Locust run is cut after this.
LOCUST_SLACK_S = 120.0
#: After a --target cell's load, how long the OTLP receiver waits for the target's
#: batch exporter to send what it still holds (OTel's default schedule delay is 5 s).
OTLP_FLUSH_WAIT_S = 6.0


def run_load_cell(cell: Cell, cell_dir: Path, settings: CellSettings, show: Show) -> CellResult:
    """A served cell (the bundled engine started here) or a --target cell.

    Always returns the result with run.json written: a server that does not come up
    fails the cell (its log tail kept; the run goes on to the next cell), a Locust that
    crashes or hangs fails it but what was recorded is still collected. An exception
    (Ctrl-C) stops Locust, the OTLP receiver, the metrics source and the server, in
    that order, and propagates, leaving no run.json.
    """
    started = time.monotonic()
    scheduled, duration = settings.planned()
    run = LoadCell(
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
    target_check = None
    with ExitStack() as stack:
        server = None
        url = settings.target
        if run.result.mode == "serve":
            server = _start_server(stack, run)
            if server is None:  # recorded as the cell's failure; already stopped
                run.result.wall_s = time.monotonic() - started
                note_files(run.result, ("requests.parquet",))
                return write_cell_info(run.result, settings, run.info)
            url = server.url
        else:
            assert url is not None  # a cell that is not served is a --target's
            run.info["url"] = redact_url(url)
            run.info[TARGET_KNOBS_KEY] = settings.target_knobs
            before = read_target_info(url, settings.api_key, settings.target_model)
            target_check = _find_target_check(run, url, before)
        load_s = _run_load(run, url)
        if server is not None:
            _stop_server(server, run)
        else:
            after = read_target_info(url, settings.api_key, settings.target_model)
            run.info[TARGET_INFO_KEY] = {"before": before, "after": after}
    epoch = server.health.get("clock_epoch_unix") if server is not None else None
    collect(run.result, settings, run.records, run.raw, epoch, run.info, load_s)
    if run.result.mode == "serve":
        _check_simulator(run)
    elif target_check is not None:
        _check_target_simulator(run, target_check)
    run.result.wall_s = time.monotonic() - started
    return write_cell_info(run.result, settings, run.info)


def _check_simulator(run: LoadCell) -> None:
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
        run.info[simulator_check.COST_FIT_KEY] = simulator_check.fit_into_store(
            run.cell,
            check,
            run.cell_dir,
            run.show,
            faults=run.info.get("faults"),
            keep_off_speed_sources=settings.keep_off_speed_sources,
        )
    except Exception as exc:  # noqa: BLE001 - as above
        run.result.warnings.append(f"cost model fit: {type(exc).__name__}: {exc}")


def _find_target_check(run: LoadCell, url: str, before: dict):
    """The stored fit of the cell's target (harness/run/target_check.py), found before the
    load; None (with the cell's warning) when its identity cannot be read."""
    from harness.run.target_check import find_check

    settings = run.settings
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        found = find_check(url, before, settings.target_knobs, settings.machine, headers)
    except Exception as exc:  # noqa: BLE001 - the load runs without a check
        found = f"{type(exc).__name__}: {exc}"
    if isinstance(found, str):
        run.result.warnings.append(f"simulator check: the target's identity: {found}")
        return None
    return found


def _check_target_simulator(run: LoadCell, check) -> None:
    """A --target cell's schedule simulated with its target's stored fit; never its
    failure."""
    from harness.run.simulator_check import RUN_JSON_KEY
    from harness.run.target_check import simulate_target

    settings = run.settings
    try:
        run.info[RUN_JSON_KEY] = simulate_target(
            check, run.cell.name, settings.profile, settings.seed, run.cell_dir, run.show
        )
    except Exception as exc:  # noqa: BLE001 - the target's records stand without it
        run.result.warnings.append(f"simulator check: {type(exc).__name__}: {exc}")


def _serve_args(cell: Cell, settings: CellSettings, raw: Path) -> list[str]:
    """``schedscope serve`` arguments of a served cell: its policy and knobs, its record
    and trace files under ``raw``, then its cost model and torch threads."""
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
    return args


def _start_server(stack: ExitStack, run: LoadCell) -> ServedEngine | None:
    """Start ``schedscope serve`` and wait until it is healthy. Its stop goes on
    ``stack`` before it starts, so an interrupted start stops it too.

    Returns the healthy server (its URL and clock epoch in ``run.info``), or None when
    it did not come up: the cell's infrastructure failure (with the log tail) and the
    server's exit code are then recorded, and the server is already stopped.
    """
    settings = run.settings
    split = settings.cpu_split
    server = ServedEngine(
        _serve_args(run.cell, settings, run.raw),
        run.cell_dir / "serve.log",
        settings.start_timeout_s,
        cpus=split.serve if split is not None else None,
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
    # the cores the server says it runs on: the split as it took effect, not as asked
    run.info["serve_cpus"] = server.health.get("cpus")
    return server


def _run_load(run: LoadCell, url: str) -> float:
    """The load against ``url`` with its telemetry around it: start the metrics source
    and the OTLP receiver, run Locust, then stop the receiver (after the target's flush
    wait) and the metrics source (metrics.parquet written), in that order.

    Returns the load's wall seconds, from just before the metrics source started to
    Locust's end: the duration the cell's summary divides by.
    """
    load_start = time.time()
    with ExitStack() as metrics_scope:
        metrics = start_metrics(metrics_scope, run, url)
        with ExitStack() as load_scope:
            receiver = start_otlp_receiver(load_scope, run)
            load_end = _run_locust(load_scope, run, url, metrics)
            if receiver is not None:
                time.sleep(OTLP_FLUSH_WAIT_S)  # the target's batch exporter sends what it holds
        # The receivers stopped with load_scope: every span they got is in the file.
        if receiver is not None:
            run.info["otlp_spans_received"] = receiver.num_spans
        # Exported while a real Prometheus still runs; it stops with metrics_scope.
        stop_metrics(metrics, run, load_start)
    return load_end - load_start


def _run_locust(stack: ExitStack, run: LoadCell, url: str, metrics: MetricsSource) -> float:
    """Run Locust against ``url`` until it exits or its deadline passes (the schedule,
    the grace, then LOCUST_SLACK_S), showing live figures every second; a Locust still
    running at an exception is stopped by ``stack``. Records its exit code; a hung or
    crashed Locust is the cell's infrastructure failure. Returns when it ended (Unix s).
    """
    cell, settings = run.cell, run.settings
    grace_s = settings.grace_s if settings.grace_s is not None else GRACE_S
    locust = LocustRun(
        profile_file(settings.profile_name, run.cell_dir, ship=settings.ship_profile),
        url,
        run.records,
        run.cell_dir / "locust.log",
        cell.rate_scale,
        settings.duration_scale,
        settings.seed,
        extra=list(settings.locust_args),
        grace_s=grace_s,
        secrets={env_var("--api-key"): settings.api_key} if settings.api_key else None,
        # a --target's server is not ours to pin; its load generator only where told
        cpus=load_generator_cores(settings.cpu_split, run.result.mode == "target"),
    )
    run.info["locust_command"] = redact_argv(["locust", *locust.args])
    locust.start()
    stack.callback(locust.stop)
    tail = RecordsTail(run.records)
    limit_s = run.duration_s + grace_s + LOCUST_SLACK_S + settings.workers_wait_s
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


def _stop_server(server: ServedEngine, run: LoadCell) -> None:
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
