"""``schedscope run``: the policies (or a run file's matrix of cells) under Locust load,
one served engine per cell, against an external --target, or in the simulator; then the
report. The plan comes from :func:`harness.run.plan.plan_run`, the run itself from
:func:`harness.run.run_matrix` (docs/run.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from harness.cli import options
from harness.cli.app import console, err_console
from harness.cli.options import (
    check_faults,
    choose_cost_model,
    parse_cpu_split_option,
    parse_policies,
)
from harness.cli.rate_scale import rate_scale_option
from harness.costmodel.choice import cell_lines, is_named_choice
from harness.costmodel.evidence import OFF_SPEED_FACTOR
from harness.costmodel.machine import Fingerprint, fingerprint
from harness.loadgen.options import ENDPOINTS, PROMPT_MODES
from harness.processes.cpu_split import CpuSplit, serve_cores
from harness.profiles import ProfileError, resolve_profile
from harness.run.settings import START_TIMEOUT_S, RunSettings, RunSettingsError
from harness.serve.knobs import with_engine_knobs

if TYPE_CHECKING:
    from engine.core.cost_model import CostModel
    from harness.costmodel.choice import Choice
    from harness.profiles import Profile
    from harness.profiles.rate_scale import ChosenScale, RateScale
    from harness.run.matrix import Cell

#: `schedscope run`'s default --duration-scale: the `mixed` profile's 120 s schedule cut
#: to 30 s per policy, so the three policies end in about 3 minutes here (docs/run.md).
RUN_DURATION_SCALE = 0.25


@with_engine_knobs(exclude=frozenset({"scheduling_policy"}))
def run(
    knob_values: dict,
    profile: str = options.profile_option(),
    policy: str = typer.Option(
        "fcfs,sjf,priority",
        "--policy",
        help="Policies to compare: a comma-separated list of fcfs, sjf, priority and lpm "
        "(longest cached prefix first; fcfs with prefix caching off), or 'all' (all four).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Run root (default: runs/<YYYYmmdd-HHMMSS>)."
    ),
    duration_scale: float = options.duration_scale_option(
        RUN_DURATION_SCALE, "A few minutes for three policies."
    ),
    rate_scale: str = rate_scale_option(
        "With a run file's rate_scales, each is a multiple of the chosen scale."
    ),
    seed: int | None = options.seed_option(),
    repeats: int = typer.Option(
        1,
        "--repeats",
        help="Serve every cell N times (cells <name>-r1..rN, in rounds); schedscope gate "
        "pools the repeats of a cell (docs/gate.md).",
    ),
    run_file: Path | None = typer.Option(
        None,
        "--run-file",
        help="TOML run file: a matrix of policies x knob sets x rate scales (docs/run.md).",
    ),
    simulate_mode: bool = typer.Option(
        False, "--simulate", help="Run the same matrix in the simulator (seconds), then the report."
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="Drive this external OpenAI-compatible server (e.g. vLLM) instead of the bundled "
        "engine; scrape its /metrics.",
    ),
    label: str = typer.Option("target", "--label", help="The --target run's name in the report."),
    target_trace_file: Path | None = typer.Option(
        None,
        "--target-trace-file",
        help="With --target: an OTLP-JSON lines file the target writes its spans to; read "
        "into spans.parquet at the end.",
    ),
    target_otlp_port: int | None = typer.Option(
        None,
        "--target-otlp-port",
        help="With --target: receive the target's spans over OTLP/HTTP at "
        "http://127.0.0.1:PORT/v1/traces (start the target exporting there, e.g. vLLM's "
        "--otlp-traces-endpoint with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); they "
        "become spans.parquet.",
    ),
    target_otlp_grpc_port: int | None = typer.Option(
        None,
        "--target-otlp-grpc-port",
        help="With --target: receive the target's spans over OTLP/gRPC (plaintext) at "
        "127.0.0.1:PORT (vLLM's default exporter protocol: start it with "
        "--otlp-traces-endpoint http://127.0.0.1:PORT and "
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true); they become spans.parquet. May be given "
        "with --target-otlp-port (another port).",
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="SCHEDSCOPE_API_KEY", help="Bearer token for --target."
    ),
    executor: str = options.executor_option(),
    cost_model: str | None = options.cost_model_option("For --simulate and --executor sim."),
    torch_threads: int | None = options.torch_threads_option(),
    cpu_split: str = options.cpu_split_option(),
    prometheus: bool = typer.Option(
        False,
        "--prometheus",
        help="Scrape with a real Prometheus (Debian's binary) and export its series at the end, "
        "instead of scraping /metrics directly.",
    ),
    grace: float | None = typer.Option(
        None,
        "--grace",
        help="Seconds Locust waits after the schedule for the last responses (then what is "
        "still in flight is cut, and censored in the statistics). Default: each served cell's "
        "own, 30 s + 3x the drain its cost model predicts, at most 900 s; a --target's 120 s.",
    ),
    start_timeout: float = typer.Option(
        START_TIMEOUT_S, "--start-timeout", help="Seconds the server may take to become healthy."
    ),
    keep_raw: bool = typer.Option(
        True,
        "--keep-raw/--no-keep-raw",
        help="Keep each cell's raw/ (the engine's own record files, the trace file).",
    ),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Generate the report at the end."
    ),
    prompt_mode: str | None = typer.Option(
        None,
        "--prompt-mode",
        envvar="LOCUST_PROMPT_MODE",
        help="Completions prompts: token_ids (exact lengths), text (words sized with the "
        "server's /tokenize) or auto (token ids below the vocabulary bound the target's "
        "/tokenize shows, else text). Default: auto with --target, token_ids served.",
    ),
    endpoint: str = typer.Option(
        "completions",
        "--endpoint",
        envvar="LOCUST_ENDPOINT",
        help="The load generator's endpoint: completions (/v1/completions) or chat "
        "(/v1/chat/completions, text prompts).",
    ),
    target_model: str | None = typer.Option(
        None,
        "--target-model",
        help="With --target: the model name to send (default: the first of its /v1/models).",
    ),
    target_knobs: str | None = typer.Option(
        None,
        "--target-knobs",
        help="With --target: the knobs it was started with, in vLLM's flag names "
        '("--max-num-seqs 64 --max-num-batched-tokens 4096"), recorded in each cell\'s '
        "run.json so `schedscope calibrate --from-run` fits and names the engine they made "
        "(a target does not say them all: vLLM's /metrics gives its KV cache only).",
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        "--processes",
        help="Load-generator processes on this machine (Locust's --processes: a local master "
        "and N workers; the schedule split exactly, records collected by the master).",
    ),
    expect_workers: int | None = typer.Option(
        None,
        "--expect-workers",
        help="Run the load generator's master only and wait (at most --workers-wait s) for "
        "N workers started elsewhere with `schedscope worker --master-host THIS_HOST "
        "[--master-port P]`.",
    ),
    remote_workers: bool = typer.Option(
        False,
        "--remote-workers",
        help="The load generator's workers run elsewhere: the master only, waiting for "
        "--expect-workers N of them (default 1). --expect-workers alone implies it.",
    ),
    master_port: int = typer.Option(
        5557, "--master-port", help="With --expect-workers: the port the workers connect to."
    ),
    master_bind_host: str = typer.Option(
        "127.0.0.1",
        "--master-bind-host",
        help="The interface the load generator's master listens on for its workers "
        "(default 127.0.0.1: this machine only; `*` or 0.0.0.0: every interface, for "
        "--expect-workers with workers elsewhere, on a trusted network only).",
    ),
    workers_wait: float = typer.Option(
        300.0,
        "--workers-wait",
        help="With --expect-workers: seconds each cell waits for its workers to connect.",
    ),
    max_error_rate: float | None = typer.Option(
        None,
        "--max-error-rate",
        help="Exit 3 when any cell's share of failed requests exceeds this (0..1; default "
        "0.05; 1 never).",
    ),
    keep_off_speed_sources: bool = typer.Option(
        False,
        "--keep-off-speed-sources",
        help="A served cell's refit of this machine's cost model keeps the sources (earlier "
        f"cells, this one) whose steps ran more than {OFF_SPEED_FACTOR:g}x off the median of "
        "the sources' speeds; by default they are left out, and run.json and the report "
        "name them.",
    ),
) -> None:
    """Compare scheduling policies under Locust load: one served engine per policy (or a
    --target, or --simulate), records, spans and metrics per policy in
    runs/<timestamp>/<policy>/, a summary table, then the report; prints the report's
    path last (docs/run.md)."""
    import sys

    from harness.cli import rate_scale as scale_flag
    from harness.run import CellMachine, RunFileError, RunOptions, run_matrix
    from harness.run.plan import plan_run
    from harness.run.termination import sigterm_stops_the_run

    policies = parse_policies(policy)
    check_faults()
    if simulate_mode and target:
        raise typer.BadParameter(
            "--simulate and --target exclude each other", param_hint="--target"
        )
    if duration_scale <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--duration-scale")
    spec = scale_flag.parse(rate_scale)
    if repeats < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--repeats")
    if prompt_mode is not None and prompt_mode not in PROMPT_MODES:
        raise typer.BadParameter(
            f"{prompt_mode!r}: expected one of {', '.join(PROMPT_MODES)}",
            param_hint="--prompt-mode (or LOCUST_PROMPT_MODE)",
        )
    if endpoint not in ENDPOINTS:
        raise typer.BadParameter(
            f"{endpoint!r}: expected one of {', '.join(ENDPOINTS)}",
            param_hint="--endpoint (or LOCUST_ENDPOINT)",
        )
    settings = _settings(
        target_knobs=target_knobs,
        target_model=target_model,
        executor=executor,
        torch_threads=torch_threads,
        cpu_split=parse_cpu_split_option(cpu_split),
        target=target,
        target_trace_file=target_trace_file,
        target_otlp_port=target_otlp_port,
        target_otlp_grpc_port=target_otlp_grpc_port,
        api_key=api_key,
        prometheus=prometheus,
        grace_s=grace,
        start_timeout_s=start_timeout,
        keep_off_speed_sources=keep_off_speed_sources,
    )
    if max_error_rate is None:
        from harness.report.errors import HIGH_ERROR_RATE

        max_error_rate = HIGH_ERROR_RATE
    if not 0 <= max_error_rate <= 1:
        raise typer.BadParameter(
            f"{max_error_rate:g}: must be in [0, 1]", param_hint="--max-error-rate"
        )
    try:
        plan = plan_run(
            policies,
            dict(knob_values),
            spec.factor or 1.0,
            profile,
            duration_scale,
            seed,
            run_file=run_file,
            target_label=label if target else None,
            repeats=repeats,
        )
    except RunFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--run-file" if run_file else None) from None
    if remote_workers and expect_workers is None:
        expect_workers = 1
    if expect_workers:
        _check_shippable(plan.profile)
    try:
        scaled = resolve_profile(plan.profile).with_duration_scale(plan.duration_scale)
    except ProfileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None
    if plan.seed is None:
        # the seed the schedule uses, recorded as such: a run without --seed is the
        # profile's own schedule, and run.json, summary.json and the gate say which
        plan.seed = scaled.seed
    from harness.run.loadgen import distribution_args, worker_line

    try:
        spread = distribution_args(
            workers, expect_workers, master_port, workers_wait, master_bind_host
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workers/--expect-workers") from None
    machines = {
        c.name: _cell_machine(
            c, simulate_mode, settings.target, executor, torch_threads, settings.cpu_split
        )
        for c in plan.cells
    }
    cost_models = _cost_model_files(
        cost_model,
        plan.cells,
        machines,
        uses=lambda c: simulate_mode or (c.setting("executor", executor) == "sim" and not target),
    )
    first = plan.cells[0].name
    chosen = None
    if spec.auto:
        if settings.target:
            chosen = scale_flag.probed_choice(
                spec, scaled, settings.target, endpoint=endpoint, model=target_model,
                api_key=settings.api_key or "", prompt_mode=prompt_mode or "auto", seed=seed,
            )  # fmt: skip
        else:
            chosen = _auto_scale(
                spec, scaled, plan.cells[0], simulate_mode, settings.executor, cost_model,
                cost_models[first], machines[first], seed, settings.cpu_split,
            )  # fmt: skip
        plan.cells = [
            dataclasses.replace(c, rate_scale=c.rate_scale * chosen.factor) for c in plan.cells
        ]
    try:
        for rate in {c.rate_scale for c in plan.cells}:
            scaled.with_rate_scale(rate)  # a rate scale may ask for too many requests
    except ProfileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rate-scale") from None
    settings = _settings(
        settings,
        # the run's cost model when every cell reads the same one (run.json says it)
        cost_model=cost_models[first] if len(set(cost_models.values())) == 1 else None,
        locust_args=loadgen_args(
            prompt_mode or ("auto" if target else "token_ids"), endpoint, target_model
        )
        + spread,
        workers_wait_s=workers_wait if expect_workers else 0.0,
        ship_profile=bool(expect_workers),
    )
    if expect_workers:
        import socket

        line = worker_line(socket.gethostname(), master_port)
        console.print(
            f"each cell waits for {expect_workers} worker(s); start each with: {line}"
            + (
                ""
                if target
                else " (a served cell's engine listens on loopback: its workers must run on "
                "this machine; use --target for workers elsewhere)"
            )
            + (
                f" (the master listens on {master_bind_host} only: --master-bind-host '*' "
                "for workers on other machines, on a trusted network)"
                if master_bind_host in ("127.0.0.1", "localhost", "::1")
                else ""
            ),
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    options = RunOptions(
        plan=plan,
        out=out,
        simulate=simulate_mode,
        settings=settings,
        keep_raw=keep_raw,
        argv=["schedscope", *sys.argv[1:]],
        report=report,
        max_error_rate=max_error_rate,
        machine=machines[first].to_dict(),
        cell_machines={
            name: CellMachine(machines[name].to_dict(), cost_models[name]) for name in machines
        },
        rate_scale_auto=chosen.to_dict() if chosen is not None else None,
    )
    with sigterm_stops_the_run():
        code, report_path, root = run_matrix(options, console)
    console.print(f"run: {root}", soft_wrap=True, highlight=False, markup=False)
    if report_path is not None:
        # The last line: the report's path alone (`make demo`, `| tail -1`).
        console.print(str(report_path), soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(code)


def _auto_scale(
    spec: RateScale,
    profile: Profile,
    cell: Cell,
    simulate: bool,
    executor: str,
    cost_model: str | None,
    cell_cost_model: Path | None,
    machine: Fingerprint,
    seed: int | None,
    split: CpuSplit | None = None,
) -> ChosenScale:
    """``--rate-scale auto[:F]`` for a served or simulated run (harness/cli/rate_scale.py):
    the first cell's knobs simulated with the cost model of the engine the run serves —
    the one it simulates or sleeps with, or, for the torch executor, this machine's fit,
    calibrated first when there is none (``--cost-model`` decides, as everywhere). The
    built-in model (forced) is first brought to this machine's speed by a probe of the
    torch executor on the CPU (harness/costmodel/speed_probe.py): it was fitted on
    another machine, and the torch executor serves on this one."""
    from engine.core.cost_model import CostModel
    from harness.cli import rate_scale as scale_flag

    assert cell.config is not None, "a served or simulated cell has its engine config"
    if simulate or cell.setting("executor", executor) == "sim":
        model = CostModel.load(cell_cost_model) if cell_cost_model else CostModel()
        name = str(cell_cost_model or "the built-in cost model")
    else:
        lookup = dataclasses.replace(machine, executor="torch")
        choice = choose_cost_model(cost_model if cost_model is not None else "auto", lookup)
        model, name = choice.model, str(choice.path or "the built-in cost model")
        if choice.path is None:
            model, name = _at_this_machines_speed(model, name, cell, machine, split)
    return scale_flag.simulated_choice(spec, profile, cell.config, model, name, seed)


def _at_this_machines_speed(
    model: CostModel, name: str, cell: Cell, machine: Fingerprint, split: CpuSplit | None
) -> tuple[CostModel, str]:
    """``model`` (the built-in) at the speed a probe of the torch executor measures here,
    named so; unchanged, with a warning, when the probe cannot run."""
    from harness.costmodel.speed_probe import SpeedProbeError, probe_speed

    assert cell.config is not None
    if machine.device != "cpu":
        err_console.print(
            f"warning: {name} was fitted on a CPU and this run serves on {machine.device}: "
            "its prices are not this engine's (--cost-model auto calibrates it)"
        )
        return model, name
    err_console.print(
        "rate scale auto: the built-in cost model was fitted on another machine; "
        "probing this machine's speed with the torch executor (a few seconds)"
    )
    try:
        probe = probe_speed(
            model,
            cell.config.model,
            block_size=cell.config.cache.block_size,
            threads=machine.torch_threads,
            cpus=split.serve if split is not None else None,
        )
    except SpeedProbeError as exc:
        err_console.print(f"warning: {exc}; the built-in cost model's prices as they are")
        return model, name
    scaled = f"{name} at {probe.ratio:.2f}x its step costs ({probe.line()})"
    return model.at_speed(probe.ratio), scaled


def _settings(base: RunSettings | None = None, **values: Any) -> RunSettings:
    """``base`` (or the defaults) with ``values`` over it; a value that cannot be run is
    a usage error naming its flag (exit 2)."""
    try:
        return dataclasses.replace(base, **values) if base else RunSettings(**values)
    except RunSettingsError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.flag) from None


def loadgen_args(prompt_mode: str, endpoint: str, model: str | None) -> list[str]:
    """The load generator's own arguments a run passes to every cell's Locust."""
    args = ["--prompt-mode", prompt_mode, "--endpoint", endpoint]
    return args + (["--model", model] if model else [])


def _check_shippable(profile: str) -> None:
    """With --expect-workers: a TOML profile and the files it names go to the workers
    inside the locustfile (harness/profiles/bundle.py); refuse now, as a usage error,
    when they exceed what is shipped, rather than at the first cell (sizes only: before
    a large trace is read)."""
    from harness.profiles.bundle import check_shippable
    from harness.run.loadgen import profile_path

    path = profile_path(profile)
    if path.suffix != ".toml":
        return  # a .py profile is the locustfile itself: Locust sends it
    try:
        check_shippable(path)
    except ProfileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile/--expect-workers") from None


def _cell_machine(
    cell: Cell,
    simulate: bool,
    target: str | None,
    executor: str,
    torch_threads: int | None,
    split: CpuSplit | None,
) -> Fingerprint:
    """The fingerprint of one cell's steps: its model, run by its executor (the run's
    unless its knob set sets one; ``torch`` simulated, ``external`` for a --target) with
    its torch threads (likewise; None or 0: serve's default), served pinned as ``split``
    says (a simulated run predicts a served one: the automatic split)."""
    return fingerprint(
        cell.config.model if cell.config is not None else "tiny",
        executor="torch"
        if simulate
        else ("external" if target else cell.setting("executor", executor)),
        torch_threads=cell.setting("torch_threads", torch_threads) or None,
        serve_cores=None if simulate or target else serve_cores(split),
    )


def _cost_model_files(
    value: str | None,
    cells: list[Cell],
    machines: dict[str, Fingerprint],
    uses: Callable[[Cell], bool],
) -> dict[str, Path | None]:
    """Cell name -> --cost-model as the file the cell reads (None: the built-in). A file
    is every cell's (it must be a cost model); otherwise each cell that ``uses`` one gets
    :func:`harness.cli.options.choose_cost_model`'s for its own fingerprint, with the
    torch executor (what a simulated step or the sim executor's sleep stands for), once
    per distinct fingerprint, named on stderr (with the cells, when they differ)."""
    if not is_named_choice(value):
        path = choose_cost_model(value, next(iter(machines.values()))).path
        return {c.name: path for c in cells}
    chosen: dict[str, Choice] = {}
    out: dict[str, Path | None] = {}
    lines: dict[str, str] = {}
    for cell in cells:
        if not uses(cell):
            out[cell.name] = None
            continue
        lookup = dataclasses.replace(machines[cell.name], executor="torch")
        if lookup.key not in chosen:
            chosen[lookup.key] = choose_cost_model(value, lookup, say=False)
        out[cell.name] = chosen[lookup.key].path
        lines[cell.name] = chosen[lookup.key].line
    for line in cell_lines(lines):
        err_console.print(line, soft_wrap=True, highlight=False, markup=False)
    return out
