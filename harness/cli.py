"""The ``schedscope`` command line (typer)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from engine.config import ConfigError, EngineConfig
from engine.cost_model import FEATURES, CostModel, CostModelError
from engine.policy import POLICY_NAMES
from harness.knobs import build_engine_config, with_engine_knobs
from harness.profiles import ProfileError, resolve_profile

app = typer.Typer(
    name="schedscope",
    help="Observability-first benchmark and load-testing harness for LLM inference schedulers.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

POLICY_CHOICES = POLICY_NAMES  # the policy registry


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"schedscope {version('schedscope')}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
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
        "fcfs", "--policy",
        help="fcfs, sjf or priority; a comma-separated list or 'all' compares several.",
    ),
    out: Path = typer.Option(Path("runs/simulate"), "--out", help="Directory for the records."),
    cost_model: Path | None = typer.Option(
        None, "--cost-model", help="Cost model JSON (from `schedscope calibrate`); default: built-in."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Schedule seed (default: the profile's)."),
    rate_scale: float = typer.Option(
        1.0, "--rate-scale", help="Multiply every open-loop arrival rate of the profile."
    ),
    num_requests: int | None = typer.Option(
        None, "--num-requests",
        help="Simulate exactly this many open-loop requests by repeating the profile's open phases.",
    ),
    write_decisions: bool = typer.Option(
        True, "--decisions/--no-decisions", help="Also write decisions.parquet."
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
    except ProfileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None
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
    from engine.llm_engine import default_kv_plan

    try:
        default_kv_plan(next(iter(configs.values())))  # a bad model or memory knob, named
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from None
    summary = run_simulations(
        prof, configs, model, out, seed=seed, num_requests=num_requests,
        write_decisions=write_decisions,
    )
    print_comparison(summary)
    console.print(f"records: {out}")


@app.command()
@with_engine_knobs()
def serve(
    engine_config: EngineConfig,
    knob_values: dict,
    executor: str = typer.Option("torch", "--executor",
                                 help="torch: the bundled model computes; sim: the cost model "
                                      "predicts each step and it takes that long."),
    cost_model: Path | None = typer.Option(
        None, "--cost-model",
        help="Cost model JSON: the step times of --executor sim, and the swap vs recompute "
             "prices of --preemption-mode auto; default: built-in."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8000, "--port", help="Port to bind; 0 picks a free one."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="SCHEDSCOPE_API_KEY",
        help="Require 'Authorization: Bearer KEY' on /v1/* routes.",
    ),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="The model name clients send; default: --model."
    ),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes",
                                       help="Larger request bodies get 413."),
    shutdown_timeout_s: float = typer.Option(
        10.0, "--shutdown-timeout-s",
        help="On SIGINT/SIGTERM, in-flight requests may finish for this long; then aborted.",
    ),
    record_steps: Path | None = typer.Option(
        None, "--record-steps",
        help="Write every step's record (steps.parquet columns, docs/records.md) to this "
             "file at shutdown: for `schedscope calibrate --from-steps`.",
    ),
    torch_threads: int = typer.Option(
        0, "--torch-threads",
        help="torch intra-op threads for --executor torch; 0: one fewer than the cores, so "
             "the event loop and a co-located load generator do not stall every step.",
    ),
    record_requests: Path | None = typer.Option(
        None, "--record-requests",
        help="Write the engine's record of every request (requests.parquet columns, engine "
             "times; docs/records.md) to this file at shutdown.",
    ),
    engine_core: str = typer.Option(
        "process", "--engine-core",
        help="process: the step loop runs in a process of its own, so the HTTP server's "
             "per-token work never holds the GIL a step needs (as vLLM V1's EngineCore); "
             "thread: in a thread of the server's process.",
    ),
    header_timeout_s: float = typer.Option(
        10.0, "--header-timeout",
        help="Seconds a request's headers may take to arrive (from its first byte); then "
             "408 and the connection is closed (slow-client protection).",
    ),
    body_timeout_s: float = typer.Option(
        30.0, "--body-timeout", help="Seconds a request's body may take to arrive; then 408.",
    ),
    max_connections: int = typer.Option(
        1024, "--max-connections",
        help="Open connections at most; more get a 503 with Retry-After. Lowered to fit the "
             "open-file limit.",
    ),
    metrics: bool = typer.Option(
        True, "--metrics/--no-metrics",
        help="Serve Prometheus metrics on GET /metrics (vLLM's names and schedscope_*; "
             "docs/metrics.md); --no-metrics: no registry, no observer, no route.",
    ),
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (docs/serving.md)."""
    from harness.serve import serve as run_serve

    raise typer.Exit(run_serve(
        engine_config, executor, cost_model, host, port, api_key, served_model_name,
        max_body_bytes, shutdown_timeout_s, record_steps, torch_threads, engine_core,
        record_requests, header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
        max_connections=max_connections, metrics=metrics,
    ))


@app.command("export-tokenizer")
def export_tokenizer(
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR",
                                   help="Directory to write tokenizer.json (and configs) in."),
    model: str = typer.Option("tiny", "--model",
                              help="Model preset name or checkpoint directory, as given to serve."),
) -> None:
    """Write the served model's tokenizer as a Hugging Face tokenizer.json, so load
    generators that count tokens locally (AIPerf --tokenizer, GuideLLM --processor)
    count exactly what the server counts (docs/serving.md)."""
    from engine.tokenizer import HFTokenizer, export_hf_tokenizer
    from harness.serve import tokenizer_for

    try:
        tokenizer = tokenizer_for(model)
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    try:
        path = export_hf_tokenizer(tokenizer, out_dir)
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {out_dir}: {exc.strerror or exc}",
                                 param_hint="OUT_DIR") from None
    if isinstance(tokenizer, HFTokenizer):
        console.print(f"copied {tokenizer.path} to {path}")
    else:
        console.print(f"wrote {path}: word-level, one token per whitespace-separated word, "
                      f"as the server's hash tokenizer (vocab {tokenizer.vocab_size}); counts "
                      "match the server's, token ids do not")


@app.command()
def calibrate(
    model: str = typer.Option("tiny", "--model", help="Model preset name or checkpoint directory."),
    out: Path = typer.Option(Path("cost_model.json"), "--out", help="Where to write the fitted cost model."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when present)."),
    block_size: int = typer.Option(16, "--block-size", help="KV block size to profile with."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed repetitions per step shape (median)."),
    quick: bool = typer.Option(False, "--quick", help="A small grid (seconds, for smoke tests)."),
    from_steps: list[Path] = typer.Option(
        [], "--from-steps",
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


def _calibrate_by_profiling(model: str, device: str | None, block_size: int, repeats: int,
                            quick: bool) -> CostModel:
    from engine.calibration import calibrate as run_calibration
    from engine.calibration import holdout_mix, training_grid
    from engine.model_runner import calibration_runner

    try:
        shapes = training_grid(quick) + holdout_mix(40, quick=quick)
        runner, model_name = calibration_runner(model, block_size, shapes, device)
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    return run_calibration(runner, model_name, quick=quick, repeats=repeats)


def _calibrate_from_steps(paths: list[Path], model: str) -> CostModel:
    import polars as pl

    from engine.cost_fit import CalibrationError, fit_from_steps

    frames = []
    for path in paths:
        file = path / "steps.parquet" if path.is_dir() else path
        try:
            frames.append(pl.read_parquet(file))
        except (FileNotFoundError, OSError, pl.exceptions.PolarsError) as exc:
            raise typer.BadParameter(f"{file}: cannot read step records ({exc})",
                                     param_hint="--from-steps") from None
    try:
        return fit_from_steps(frames, model=model, source=", ".join(map(str, paths)))
    except CalibrationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--from-steps") from None


def print_comparison(summary: dict) -> None:
    table = Table(title=f"schedscope simulate — profile {summary['profile']} (seed {summary['seed']})")
    for column in ("policy", "class", "ok", "rej", "ttft p50", "ttft p99", "tpot p50",
                   "e2e p99", "queue p99", "queue max", "preempt s/r", "goodput/s"):
        table.add_column(column, justify="left" if column in ("policy", "class") else "right")

    def fmt(value, unit="s") -> str:
        return "-" if value is None else f"{value:.3f}" if unit == "s" else f"{value:.2f}"

    for name, result in summary["policies"].items():
        groups = [("all", result["overall"])] + list(result["classes"].items())
        for class_name, g in groups:
            m = g["metrics"]
            table.add_row(
                name if class_name == "all" else "", class_name, str(g["counts"]["ok"]),
                str(g["counts"]["rejected"]),
                fmt(m.get("ttft_s", {}).get("p50")), fmt(m.get("ttft_s", {}).get("p99")),
                fmt(m.get("tpot_s", {}).get("p50")), fmt(m.get("e2e_s", {}).get("p99")),
                fmt(m.get("queue_s", {}).get("p99")), fmt(m.get("queue_s", {}).get("max")),
                f"{g['preemptions']['swap']}/{g['preemptions']['recompute']}",
                fmt(g["goodput_rps"], "n"),
            )
        table.add_section()
    # Piped output (make, CI logs) has no terminal width; do not squeeze the table to 80.
    out = console if console.is_terminal else Console(width=max(console.width, 160))
    out.print(table)


def engine_config_dict(config: EngineConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(config)))


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
