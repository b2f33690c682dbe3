"""``schedscope serve``: the engine behind the OpenAI-compatible HTTP server, every
engine knob a flag (:func:`harness.serve.server.serve` does the work; docs/serving.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from engine.api.state import ServerSettings
from engine.config import EngineConfig
from harness.cli import options
from harness.cli.options import choose_cost_model
from harness.costmodel.choice import AUTO, is_named_choice
from harness.costmodel.machine import fingerprint
from harness.serve.knobs import with_engine_knobs
from harness.serve.server_flags import with_server_settings


@with_engine_knobs()
@with_server_settings()
def serve(
    engine_config: EngineConfig,
    server_settings: ServerSettings,
    executor: str = options.executor_option(),
    cost_model: str | None = options.cost_model_option(
        "Also the swap vs recompute prices of --preemption-mode auto. --executor torch: "
        "default the built-in."
    ),
    served_model_name: str | None = typer.Option(
        None,
        "--served-model-name",
        help=ServerSettings.__dataclass_fields__["served_model_name"].metadata["help"],
    ),
    record_steps: Path | None = typer.Option(
        None,
        "--record-steps",
        help="Write every step's record (steps.parquet columns, docs/records.md) to this "
        "file at shutdown: for `schedscope calibrate --from-steps`.",
    ),
    torch_threads: int | None = options.torch_threads_option("0: the same default."),
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
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (docs/serving.md)."""
    from harness.serve.server import serve as run_serve

    torch_threads = torch_threads or 0  # 0: serve's default
    settings = dataclasses.replace(
        server_settings, served_model_name=served_model_name or engine_config.model
    )
    raise typer.Exit(
        run_serve(
            engine_config,
            settings,
            executor=executor,
            cost_model=_cost_model_file(cost_model, executor, engine_config.model, torch_threads),
            record_steps=record_steps,
            record_requests=record_requests,
            record_decisions=record_decisions,
            torch_threads=torch_threads,
            engine_core=engine_core,
            trace_file=trace_file,
            otlp_traces_endpoint=otlp_traces_endpoint,
            no_tracing=no_tracing,
        )
    )


def _cost_model_file(
    value: str | None, executor: str, model: str, torch_threads: int
) -> Path | None:
    """--cost-model as the file the engine loads (None: the built-in). ``--executor
    sim`` sleeps the torch engine's predicted steps, so its model is chosen as
    ``schedscope simulate`` chooses one (:func:`harness.cli.options.choose_cost_model`)
    for the torch executor's fingerprint of ``model`` and ``torch_threads`` (0: serve's
    default), named in one line on stderr; the torch executor computes its steps and
    keeps the built-in prices unless given a file (an unknown executor is serve's to
    refuse)."""
    if executor == "sim":
        machine = fingerprint(model, executor="torch", torch_threads=torch_threads or None)
        return choose_cost_model(value, machine).path
    if value == AUTO and executor == "torch":
        raise typer.BadParameter(
            "auto chooses the step times of --executor sim; the torch executor computes "
            "its steps (give builtin or a file for --preemption-mode auto's prices)",
            param_hint="--cost-model",
        )
    return None if is_named_choice(value) else Path(str(value))
