"""The ``schedscope`` command line (typer)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from engine.config import ConfigError, EngineConfig
from engine.core.cost_model import FEATURES, CostModel, CostModelError
from engine.core.sched.policy import POLICY_NAMES
from harness.knobs import build_engine_config, with_engine_knobs
from harness.profiles import ProfileError, resolve_profile

app = typer.Typer(
    name="schedscope",
    help="Observability-first benchmark and load-testing harness for LLM inference schedulers.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

POLICY_CHOICES = POLICY_NAMES  # the policy registry


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"schedscope {version('schedscope')}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """schedscope: see *why* requests were slow — per request, per decision."""


def _policies(value: str) -> list[str]:
    if value == "all":
        return list(POLICY_CHOICES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in POLICY_CHOICES]
    if not names or bad:
        raise typer.BadParameter(
            f"unknown policy {', '.join(bad) or repr(value)}; expected {', '.join(POLICY_CHOICES)}, "
            "a comma-separated list of them, or all",
            param_hint="--policy",
        )
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"policy listed twice in {value!r}", param_hint="--policy")
    return names


@app.command()
@with_engine_knobs(exclude=frozenset({"scheduling_policy"}))
def simulate(
    engine_config: EngineConfig | None,
    knob_values: dict,
    profile: str = typer.Option(
        "default", "--profile", help="Profile file (.toml or .py) or a shipped profile's name."
    ),
    policy: str = typer.Option(
        "fcfs",
        "--policy",
        help="fcfs, sjf or priority; a comma-separated list or 'all' compares several.",
    ),
    out: Path = typer.Option(Path("runs/simulate"), "--out", help="Directory for the records."),
    cost_model: Path | None = typer.Option(
        None,
        "--cost-model",
        help="Cost model JSON (from `schedscope calibrate`); default: built-in.",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Schedule seed (default: the profile's)."),
    rate_scale: float = typer.Option(
        1.0,
        "--rate-scale",
        help="Multiply every open-loop arrival rate of the profile (a replayed trace: its speed).",
    ),
    duration_scale: float = typer.Option(
        1.0,
        "--duration-scale",
        help="Multiply every phase's duration (0.1: a tenth of the run; a trace keeps the "
        "arrivals inside its shortened window).",
    ),
    num_requests: int | None = typer.Option(
        None,
        "--num-requests",
        help="Simulate exactly this many open-loop requests by repeating the profile's open phases.",
    ),
    write_decisions: bool = typer.Option(
        True, "--decisions/--no-decisions", help="Also write decisions.parquet."
    ),
    trace_file: Path | None = typer.Option(
        None,
        "--trace-file",
        help="Write the simulated spans (OTLP-JSON lines, virtual time; docs/telemetry.md) "
        "to this file, and each policy's spans.parquet next to its records.",
    ),
) -> None:
    """Simulate the engine's scheduler on a virtual clock with a cost model.

    Writes DIR/requests.parquet, DIR/decisions.parquet and DIR/summary.json (one
    policy), or DIR/<policy>/... plus a combined DIR/summary.json (several), and
    prints a comparison table. Same profile, seed and knobs: same bytes.
    """
    from harness.simulate import run_simulations

    policies = _policies(policy)
    try:
        prof = resolve_profile(profile)
        if rate_scale != 1.0:
            prof = prof.with_rate_scale(rate_scale)
        if duration_scale != 1.0:
            prof = prof.with_duration_scale(duration_scale)
    except ProfileError as exc:
        hint = "--profile"
        if str(exc).startswith("rate_scale"):
            hint = "--rate-scale"
        elif str(exc).startswith("duration_scale"):
            hint = "--duration-scale"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    try:
        model = CostModel.load(cost_model) if cost_model else CostModel()
    except CostModelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cost-model") from None
    configs = {}
    for name in policies:
        try:
            configs[name] = build_engine_config({**knob_values, "scheduling_policy": name})
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
    if num_requests is not None and num_requests < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--num-requests")
    from engine.factory import default_kv_plan

    try:
        default_kv_plan(next(iter(configs.values())))  # a bad model or memory knob, named
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if trace_file is not None and (trace_file.is_dir() or trace_file.suffix == ".parquet"):
        raise typer.BadParameter(
            f"expected an OTLP-JSON lines file (e.g. spans.jsonl), got {trace_file}",
            param_hint="--trace-file",
        )
    summary = run_simulations(
        prof,
        configs,
        model,
        out,
        seed=seed,
        num_requests=num_requests,
        write_decisions=write_decisions,
        trace_file=trace_file,
    )
    print_comparison(summary)
    console.print(f"records: {out}")
    if trace_file is not None:
        for name, policy_summary in summary["policies"].items():
            stats = policy_summary.get("tracing", {})
            line = (
                f"spans ({name}): {stats.get('spans', 0)} to {trace_file}, "
                f"{stats.get('dropped_spans', 0)} dropped"
            )
            console.print(f"[yellow]{line}[/yellow]" if stats.get("dropped_spans") else line)


#: `schedscope run`'s default --duration-scale: the `mixed` profile's 120 s schedule cut
#: to 30 s per policy, so the three policies end in about 3 minutes here (docs/run.md).
RUN_DURATION_SCALE = 0.25


@app.command()
@with_engine_knobs(exclude=frozenset({"scheduling_policy"}))
def run(
    engine_config: EngineConfig | None,
    knob_values: dict,
    profile: str = typer.Option(
        "mixed", "--profile", help="Profile: a shipped name (docs/profiles.md) or a .py/.toml file."
    ),
    policy: str = typer.Option(
        "fcfs,sjf,priority",
        "--policy",
        help="Policies to compare: a comma-separated list or 'all'.",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Run root (default: runs/<YYYYmmdd-HHMMSS>)."
    ),
    duration_scale: float = typer.Option(
        RUN_DURATION_SCALE,
        "--duration-scale",
        help="Multiply every phase's duration (default 0.25: a few minutes for three policies).",
    ),
    rate_scale: float = typer.Option(
        1.0, "--rate-scale", help="Multiply every open-loop arrival rate."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Schedule seed (default: the profile's)."),
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
        "--otlp-traces-endpoint); they become spans.parquet.",
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="SCHEDSCOPE_API_KEY", help="Bearer token for --target."
    ),
    executor: str = typer.Option(
        "torch",
        "--executor",
        help="The served engine's executor: torch (the bundled model "
        "computes) or sim (sleeps the cost model's step time).",
    ),
    cost_model: Path | None = typer.Option(
        None, "--cost-model", help="Cost model JSON for --executor sim and --simulate."
    ),
    torch_threads: int | None = typer.Option(
        None, "--torch-threads", help="Passed to schedscope serve."
    ),
    prometheus: bool = typer.Option(
        False,
        "--prometheus",
        help="Scrape with a real Prometheus (Debian's binary) and export its series at the end, "
        "instead of scraping /metrics directly.",
    ),
    grace: float = typer.Option(
        30.0, "--grace", help="Locust waits this long after the schedule for the last responses."
    ),
    start_timeout: float = typer.Option(
        180.0, "--start-timeout", help="Seconds the server may take to become healthy."
    ),
    keep_raw: bool = typer.Option(
        True,
        "--keep-raw/--no-keep-raw",
        help="Keep each cell's raw/ (the engine's own record files, the trace file).",
    ),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Generate the report at the end."
    ),
) -> None:
    """Compare scheduling policies under Locust load: one served engine per policy (or a
    --target, or --simulate), records, spans and metrics per policy in
    runs/<timestamp>/<policy>/, a summary table, then the report; prints the report's
    path last (docs/run.md)."""
    import sys

    from harness.run import RunFileError, RunOptions, RunPlan, load_run_file, run_matrix
    from harness.run.matrix import build_cells

    policies = _policies(policy)
    if simulate_mode and target:
        raise typer.BadParameter(
            "--simulate and --target exclude each other", param_hint="--target"
        )
    if executor not in ("torch", "sim"):
        raise typer.BadParameter("torch or sim", param_hint="--executor")
    if duration_scale <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--duration-scale")
    if rate_scale <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--rate-scale")
    knobs = {k: v for k, v in knob_values.items()}
    try:
        if run_file is not None:
            plan = load_run_file(
                run_file,
                knobs,
                policies,
                rate_scale,
                profile,
                duration_scale,
                seed,
                with_configs=True,
            )
        else:
            plan = RunPlan(
                build_cells(policies, knobs, [], [rate_scale]), profile, duration_scale, seed
            )
        if target:
            from harness.run.matrix import Cell

            rates = list(dict.fromkeys(c.rate_scale for c in plan.cells))
            plan.cells = [
                Cell(label + (f"-x{r:g}" if len(rates) > 1 else ""), label, None, r, {}, None)
                for r in rates
            ]
    except RunFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--run-file" if run_file else None) from None
    try:
        resolve_profile(plan.profile).with_duration_scale(plan.duration_scale)
    except ProfileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None
    if target and not target.startswith(("http://", "https://")):
        raise typer.BadParameter("expected http://HOST:PORT", param_hint="--target")
    if cost_model is not None and not cost_model.is_file():
        raise typer.BadParameter(f"{cost_model}: no such file", param_hint="--cost-model")
    settings = {
        "executor": executor,
        "cost_model": cost_model,
        "torch_threads": torch_threads,
        "target": target.rstrip("/") if target else None,
        "target_trace_file": target_trace_file,
        "target_otlp_port": target_otlp_port,
        "api_key": api_key,
        "prometheus": prometheus,
        "grace_s": grace,
        "start_timeout_s": start_timeout,
    }
    options = RunOptions(
        plan=plan,
        out=out,
        simulate=simulate_mode,
        settings=settings,
        keep_raw=keep_raw,
        argv=["schedscope", *sys.argv[1:]],
        report=report,
    )
    code, report_path, root = run_matrix(options, console)
    console.print(f"run: {root}", soft_wrap=True, highlight=False, markup=False)
    if report_path is not None:
        # The last line: the report's path alone (`make demo`, `| tail -1`).
        console.print(str(report_path), soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(code)


@app.command()
@with_engine_knobs()
def serve(
    engine_config: EngineConfig,
    knob_values: dict,
    executor: str = typer.Option(
        "torch",
        "--executor",
        help="torch: the bundled model computes; sim: the cost model "
        "predicts each step and it takes that long.",
    ),
    cost_model: Path | None = typer.Option(
        None,
        "--cost-model",
        help="Cost model JSON: the step times of --executor sim, and the swap vs recompute "
        "prices of --preemption-mode auto; default: built-in.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8000, "--port", help="Port to bind; 0 picks a free one."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="SCHEDSCOPE_API_KEY",
        help="Require 'Authorization: Bearer KEY' on /v1/* routes.",
    ),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="The model name clients send; default: --model."
    ),
    max_body_bytes: int = typer.Option(
        1 << 20, "--max-body-bytes", help="Larger request bodies get 413."
    ),
    shutdown_timeout_s: float = typer.Option(
        10.0,
        "--shutdown-timeout-s",
        help="On SIGINT/SIGTERM, in-flight requests may finish for this long; then aborted.",
    ),
    record_steps: Path | None = typer.Option(
        None,
        "--record-steps",
        help="Write every step's record (steps.parquet columns, docs/records.md) to this "
        "file at shutdown: for `schedscope calibrate --from-steps`.",
    ),
    torch_threads: int = typer.Option(
        0,
        "--torch-threads",
        help="torch intra-op threads for --executor torch; 0: one fewer than the cores, so "
        "the event loop and a co-located load generator do not stall every step.",
    ),
    record_decisions: Path | None = typer.Option(
        None,
        "--record-decisions",
        help="Write every scheduler decision (decisions.parquet columns, docs/records.md; "
        "engine times) to this file at shutdown.",
    ),
    record_requests: Path | None = typer.Option(
        None,
        "--record-requests",
        help="Write the engine's record of every request (requests.parquet columns, engine "
        "times; docs/records.md) to this file at shutdown.",
    ),
    engine_core: str = typer.Option(
        "process",
        "--engine-core",
        help="process: the step loop runs in a process of its own, so the HTTP server's "
        "per-token work never holds the GIL a step needs (as vLLM V1's EngineCore); "
        "thread: in a thread of the server's process.",
    ),
    header_timeout_s: float = typer.Option(
        10.0,
        "--header-timeout",
        help="Seconds from a connection's opening, or the end of its last response, until "
        "the next request's headers are complete; then 408 and close (slow-client "
        "protection; also the keep-alive timeout).",
    ),
    body_timeout_s: float = typer.Option(
        30.0,
        "--body-timeout",
        help="Seconds a request's body may take to arrive; then 408.",
    ),
    max_connections: int = typer.Option(
        1024,
        "--max-connections",
        help="Open connections at most; at the cap the longest-idle one is closed for a new "
        "one, or, none idle, the new one gets a 503. Lowered to fit the open-file limit.",
    ),
    trace_file: Path | None = typer.Option(
        None,
        "--trace-file",
        help="Write the engine's spans to this file (OTLP-JSON lines; docs/telemetry.md).",
    ),
    otlp_traces_endpoint: str | None = typer.Option(
        None,
        "--otlp-traces-endpoint",
        help="Export spans over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318/v1/traces); "
        "default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT when set.",
    ),
    no_tracing: bool = typer.Option(
        False,
        "--no-tracing",
        help="No spans at all, whatever the flags and OTEL_* variables say.",
    ),
    metrics: bool = typer.Option(
        True,
        "--metrics/--no-metrics",
        help="Serve Prometheus metrics on GET /metrics (vLLM's names and schedscope_*; "
        "docs/metrics.md); --no-metrics: no registry, no observer, no route.",
    ),
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (docs/serving.md)."""
    from harness.serve import serve as run_serve

    raise typer.Exit(
        run_serve(
            engine_config,
            executor,
            cost_model,
            host,
            port,
            api_key,
            served_model_name,
            max_body_bytes,
            shutdown_timeout_s,
            record_steps,
            torch_threads,
            engine_core,
            record_requests,
            header_timeout_s=header_timeout_s,
            body_timeout_s=body_timeout_s,
            max_connections=max_connections,
            trace_file=trace_file,
            otlp_traces_endpoint=otlp_traces_endpoint,
            no_tracing=no_tracing,
            metrics=metrics,
            record_decisions=record_decisions,
        )
    )


@app.command("export-tokenizer")
def export_tokenizer(
    out_dir: Path = typer.Argument(
        ..., metavar="OUT_DIR", help="Directory to write tokenizer.json (and configs) in."
    ),
    model: str = typer.Option(
        "tiny", "--model", help="Model preset name or checkpoint directory, as given to serve."
    ),
) -> None:
    """Write the served model's tokenizer as a Hugging Face tokenizer.json, so load
    generators that count tokens locally (AIPerf --tokenizer, GuideLLM --processor)
    count exactly what the server counts (docs/serving.md)."""
    from engine.serving.tokenizer import HFTokenizer, export_hf_tokenizer
    from harness.serve import tokenizer_for

    try:
        tokenizer = tokenizer_for(model)
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    try:
        path = export_hf_tokenizer(tokenizer, out_dir)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot write {out_dir}: {exc.strerror or exc}", param_hint="OUT_DIR"
        ) from None
    if isinstance(tokenizer, HFTokenizer):
        console.print(f"copied {tokenizer.path} to {path}")
    else:
        console.print(
            f"wrote {path}: word-level, one token per whitespace-separated word, "
            f"as the server's hash tokenizer (vocab {tokenizer.vocab_size}); counts "
            "match the server's, token ids do not"
        )


@app.command()
def calibrate(
    model: str = typer.Option("tiny", "--model", help="Model preset name or checkpoint directory."),
    out: Path = typer.Option(
        Path("cost_model.json"), "--out", help="Where to write the fitted cost model."
    ),
    device: str | None = typer.Option(
        None, "--device", help="cpu or cuda (default: cuda when present)."
    ),
    block_size: int = typer.Option(16, "--block-size", help="KV block size to profile with."),
    repeats: int = typer.Option(
        5, "--repeats", min=1, help="Timed repetitions per step shape (median)."
    ),
    quick: bool = typer.Option(False, "--quick", help="A small grid (seconds, for smoke tests)."),
    from_steps: list[Path] = typer.Option(
        [],
        "--from-steps",
        help="Fit from the step records of real runs instead (steps.parquet from "
        "`schedscope serve --record-steps` or a run directory; repeatable): each "
        "step's full cycle, serving overhead included, so simulations predict served "
        "runs. No profiling.",
    ),
) -> None:
    """Fit the simulator's cost model: by profiling the real model runner, or from the
    step records of served runs (--from-steps).

    Profiling measures steps over a grid of prefill tokens, decode batch sizes, context
    lengths and swapped blocks, fits the cost model, and reports its error on held-out
    mixed batches. Use the file with `schedscope simulate --cost-model FILE`.
    """
    if from_steps:
        fitted = _calibrate_from_steps(from_steps, model)
    else:
        fitted = _calibrate_by_profiling(model, device, block_size, repeats, quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    fitted.save(out)
    table = Table(title=f"cost model for {fitted.model} on {fitted.device}")
    table.add_column("parameter")
    table.add_column("value", justify="right")
    for name in FEATURES:
        table.add_row(name, f"{getattr(fitted, name):.3e}")
    console.print(table)
    fit = fitted.fit
    console.print(
        f"held-out median relative error {fit['holdout_median_rel_error']:.1%} "
        f"(p90 {fit['holdout_p90_rel_error']:.1%}) over {fit['holdout_points']} "
        f"{'held-out steps' if from_steps else 'mixed batches'}; target <= 10% at the median"
    )
    console.print(f"written: {out}")


def _calibrate_by_profiling(
    model: str, device: str | None, block_size: int, repeats: int, quick: bool
) -> CostModel:
    from engine.sim.calibration import calibrate as run_calibration
    from engine.sim.calibration import holdout_mix, training_grid
    from engine.worker.loading import calibration_runner

    try:
        shapes = training_grid(quick) + holdout_mix(40, quick=quick)
        runner, model_name = calibration_runner(model, block_size, shapes, device)
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    return run_calibration(runner, model_name, quick=quick, repeats=repeats)


def _calibrate_from_steps(paths: list[Path], model: str) -> CostModel:
    import polars as pl

    from engine.sim.cost_fit import CalibrationError, client_latency_from_requests, fit_from_steps

    frames, request_frames = [], []
    for path in paths:
        file = path / "steps.parquet" if path.is_dir() else path
        try:
            frames.append(pl.read_parquet(file))
        except (FileNotFoundError, OSError, pl.exceptions.PolarsError) as exc:
            raise typer.BadParameter(
                f"{file}: cannot read step records ({exc})", param_hint="--from-steps"
            ) from None
        # A `schedscope run` cell also has the client's records: the time spent outside
        # the engine (HTTP, the pipe, SSE) is measured there, not guessed.
        requests_file = file.with_name("requests.parquet")
        if requests_file.exists():
            try:
                request_frames.append(pl.read_parquet(requests_file))
            except (OSError, pl.exceptions.PolarsError) as exc:
                raise typer.BadParameter(
                    f"{requests_file}: cannot read request records ({exc})",
                    param_hint="--from-steps",
                ) from None
    latency = client_latency_from_requests(request_frames)
    if latency is None:
        console.print(
            "client latency: 0 (no client records beside the step records; "
            "a `schedscope run` cell has them)"
        )
    else:
        console.print(
            f"client latency: {latency[0] * 1e3:.2f} ms (median over {latency[1]} requests)"
        )
    try:
        return fit_from_steps(
            frames,
            model=model,
            source=", ".join(map(str, paths)),
            client_latency_s=latency[0] if latency else 0.0,
        )
    except CalibrationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--from-steps") from None


def print_comparison(summary: dict) -> None:
    table = Table(
        title=f"schedscope simulate — profile {summary['profile']} (seed {summary['seed']})"
    )
    for column in (
        "policy",
        "class",
        "ok",
        "rej",
        "ttft p50",
        "ttft p99",
        "tpot p50",
        "e2e p99",
        "queue p99",
        "queue max",
        "preempt s/r",
        "goodput/s",
    ):
        table.add_column(column, justify="left" if column in ("policy", "class") else "right")

    def fmt(value, unit="s") -> str:
        return "-" if value is None else f"{value:.3f}" if unit == "s" else f"{value:.2f}"

    for name, result in summary["policies"].items():
        groups = [("all", result["overall"])] + list(result["classes"].items())
        for class_name, g in groups:
            m = g["metrics"]
            table.add_row(
                name if class_name == "all" else "",
                class_name,
                str(g["counts"]["ok"]),
                str(g["counts"]["rejected"]),
                fmt(m.get("ttft_s", {}).get("p50")),
                fmt(m.get("ttft_s", {}).get("p99")),
                fmt(m.get("tpot_s", {}).get("p50")),
                fmt(m.get("e2e_s", {}).get("p99")),
                fmt(m.get("queue_s", {}).get("p99")),
                fmt(m.get("queue_s", {}).get("max")),
                f"{g['preemptions']['swap']}/{g['preemptions']['recompute']}",
                fmt(g["goodput_rps"], "n"),
            )
        table.add_section()
    # Piped output (make, CI logs) has no terminal width; do not squeeze the table to 80.
    out = console if console.is_terminal else Console(width=max(console.width, 160))
    out.print(table)


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(
        ...,
        help="Run directories (RUN/<policy>/requests.parquet ...); several are compared side by side, labelled by directory name.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Where to write report.html, report.md, summary.json and the Parquet files (default: the first RUN_DIR).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Profile (name or file) whose class SLOs define goodput; default: the run's own.",
    ),
    stall_threshold: float | None = typer.Option(
        None,
        "--stall-threshold",
        help="Stall threshold in seconds (default: the larger of 250 ms and 5x the run's median ITL).",
    ),
    bootstrap: int = typer.Option(
        200, "--bootstrap", help="Bootstrap resamples for the verdicts' noise check."
    ),
    seed: int = typer.Option(20260101, "--seed", help="Bootstrap seed."),
) -> None:
    """Regenerate the report from stored run data (docs/report.md): tables per policy x
    class, stall attribution, diagnosis of the known traps, verdicts and pictures."""
    from harness.report import ReportInputError, ReportOptions, generate_report

    if stall_threshold is not None and stall_threshold <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--stall-threshold")
    if bootstrap < 10:
        raise typer.BadParameter("must be >= 10", param_hint="--bootstrap")
    options = ReportOptions(
        stall_threshold_s=stall_threshold, profile=profile, resamples=bootstrap, seed=seed
    )
    try:
        paths = generate_report(run_dirs, out, options)
    except ReportInputError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    summary = json.loads(paths["summary"].read_text())
    for line in summary.get("missing", []):
        console.print(f"[yellow]missing:[/yellow] {line}")
    for finding in summary.get("diagnosis", []):
        console.print(
            f"[red]trap {finding['trap']}[/red] {finding['run']}/{finding['policy']}: "
            f"{finding['message']}"
        )
    for entry in summary.get("verdicts", {}).values():
        console.print(entry["sentence"], soft_wrap=True)
    console.print(f"markdown: {paths['markdown']}")
    console.print(f"summary: {paths['summary']}")
    console.print(f"report: {paths['html']}", soft_wrap=True)


dashboards_app = typer.Typer(
    help="Grafana dashboards built as code: build the JSON, push it to a Grafana (docs/dashboards.md).",
    no_args_is_help=True,
)
app.add_typer(dashboards_app, name="dashboards")


@dashboards_app.command("build")
def dashboards_build(
    out: Path = typer.Option(
        Path("dashboards"),
        "--out",
        help="Directory for the dashboard JSON files (the repository's dashboards/).",
    ),
) -> None:
    """Regenerate the dashboards' JSON from harness/dashboards.py."""
    from harness.dashboards import write_dashboards

    try:
        paths = write_dashboards(out)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot write {out}: {exc.strerror or exc}", param_hint="--out"
        ) from None
    for path in paths:
        console.print(f"wrote {path}")


@dashboards_app.command("push")
def dashboards_push(
    grafana_url: str = typer.Option(
        ...,
        "--grafana-url",
        envvar="GRAFANA_URL",
        help="Grafana's base URL, e.g. http://localhost:3000.",
    ),
    folder_uid: str | None = typer.Option(
        None, "--folder-uid", help="Put the dashboards in this folder (default: General)."
    ),
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="Seconds per HTTP request."),
) -> None:
    """Upload the dashboards to Grafana, overwriting by uid (token from GRAFANA_TOKEN)."""
    import os

    from harness.dashboards import DASHBOARDS, dashboard_dict
    from harness.grafana_push import TOKEN_ENV, PushError, push_dashboards

    token = os.environ.get(TOKEN_ENV) or None
    if token is None:
        err_console.print(f"{TOKEN_ENV} is not set: pushing without credentials")
    try:
        results = push_dashboards(
            grafana_url,
            token,
            [dashboard_dict(uid) for uid in DASHBOARDS],
            folder_uid=folder_uid,
            timeout_s=timeout_s,
        )
    except PushError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    for result in results:
        where = f" at {result.url}" if result.url else ""
        console.print(
            f"pushed {result.uid} (version {result.version}){where}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def engine_config_dict(config: EngineConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(config)))


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
