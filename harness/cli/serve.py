"""``schedscope serve``: the engine behind the OpenAI-compatible HTTP server, every
engine knob a flag (:func:`harness.serve.server.serve` does the work; docs/serving.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import EngineConfig
from harness.cli import options
from harness.cli.options import choose_cost_model
from harness.costmodel.choice import AUTO, is_named_choice
from harness.costmodel.machine import fingerprint
from harness.serve.knobs import with_engine_knobs


@with_engine_knobs()
def serve(
    engine_config: EngineConfig,
    executor: str = options.executor_option(),
    cost_model: str | None = options.cost_model_option(
        "Also the swap vs recompute prices of --preemption-mode auto. --executor torch: "
        "default the built-in."
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
    max_connections_per_client: int | None = typer.Option(
        None,
        "--max-connections-per-client",
        help="Open connections of one client (peer address; an IPv6 /64) at most; at its "
        "cap its own longest-idle one is closed for a new one, or, none idle, the new one "
        "gets a 429. Connections from the server's own address (this machine) are not "
        "limited. Default: half of --max-connections.",
    ),
    max_tokenize_body_bytes: int = typer.Option(
        256 * 1024,
        "--max-tokenize-body-bytes",
        help="Larger /tokenize and /detokenize bodies get 413.",
    ),
    max_tokenize_tokens: int = typer.Option(
        131072,
        "--max-tokenize-tokens",
        help="/tokenize answers at most this many tokens, /detokenize decodes at most this "
        "many; more is a 400 naming the limit.",
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
    engine_liveness_timeout_s: float = typer.Option(
        30.0,
        "--engine-liveness-timeout-s",
        help="/health answers 503 'stalled' when the engine has had work and not stepped "
        "for longer than this (hung, or stopped); long enough for a legitimate long step on "
        "a slow CPU. 0: no deadline.",
    ),
    metrics: bool = typer.Option(
        True,
        "--metrics/--no-metrics",
        help="Serve Prometheus metrics on GET /metrics (vLLM's names and schedscope_*; "
        "docs/metrics.md); --no-metrics: no registry, no observer, no route.",
    ),
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (docs/serving.md)."""
    from harness.serve.server import serve as run_serve

    torch_threads = torch_threads or 0  # 0: serve's default
    raise typer.Exit(
        run_serve(
            engine_config,
            executor,
            _cost_model_file(cost_model, executor, engine_config.model, torch_threads),
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
            max_connections_per_client=max_connections_per_client,
            max_tokenize_body_bytes=max_tokenize_body_bytes,
            max_tokenize_tokens=max_tokenize_tokens,
            trace_file=trace_file,
            otlp_traces_endpoint=otlp_traces_endpoint,
            no_tracing=no_tracing,
            metrics=metrics,
            record_decisions=record_decisions,
            engine_liveness_timeout_s=engine_liveness_timeout_s,
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
