"""``schedscope serve``: the engine behind the OpenAI-compatible HTTP server."""

from __future__ import annotations

import logging
import os
import sys
from functools import partial
from pathlib import Path

import typer

from engine.api.state import ServerSettings
from engine.config import ConfigError, EngineConfig
from engine.core.cost_model import CostModel, CostModelError
from engine.factory import EXECUTORS, build_engine
from engine.records.writers import LostRecord, RecordWriterSpec
from engine.serving.tokenizer import HashTokenizer, Tokenizer, load_tokenizer
from harness.costmodel.machine import serving_torch_threads
from harness.records.decision_log import SCHEMA as DECISION_SCHEMA
from harness.records.decision_log import DecisionLog
from harness.records.incremental import (
    FLUSH_INTERVAL_S,
    IncrementalRecordWriter,
    parts_dir,
    recover_record_file,
)
from harness.records.requests import REQUEST_SCHEMA, RequestRecorder
from harness.records.steps import STEP_SCHEMA, StepLog

log = logging.getLogger("schedscope.serve")

#: Where the step loop runs: a process of its own (no GIL shared with the HTTP server),
#: or a thread of the server's process.
ENGINE_CORES = ("process", "thread")


def tokenizer_for(model: str) -> Tokenizer:
    """The hash tokenizer over a preset's vocabulary; for a checkpoint directory, its
    ``tokenizer.json`` when it has one."""
    from engine.worker.model_config import PRESETS, ModelConfig

    if model in PRESETS:
        preset = PRESETS[model]
        return HashTokenizer(preset.vocab_size, preset.eos_token_id)
    path = Path(model)
    if (path / "config.json").is_file():
        config = ModelConfig.from_json(path / "config.json")
        return load_tokenizer(path, config.vocab_size, config.eos_token_id)
    raise ConfigError(
        f"model {model!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor "
        "a directory with a config.json"
    )


def serve(
    engine_config: EngineConfig,
    settings: ServerSettings,
    *,
    executor: str = "torch",
    cost_model: Path | None = None,
    record_steps: Path | None = None,
    record_requests: Path | None = None,
    record_decisions: Path | None = None,
    torch_threads: int = 0,
    engine_core: str = "process",
    trace_file: Path | None = None,
    otlp_traces_endpoint: str | None = None,
    no_tracing: bool = False,
) -> int:
    """Build the engine, serve it with ``settings`` (validated: ``ServerSettings.validate``)
    until SIGINT/SIGTERM, drain; returns the exit code (1 when the engine died:
    ``engine.api.signals.EXIT_ENGINE_LOST``). Flag mistakes raise ``typer.BadParameter``
    (exit 2) naming the flag."""
    if executor not in EXECUTORS:
        raise typer.BadParameter(
            f"expected one of {', '.join(EXECUTORS)}, got {executor!r}", param_hint="--executor"
        )
    try:
        model = CostModel.load(cost_model) if cost_model else None
    except CostModelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cost-model") from None
    try:
        tokenizer = tokenizer_for(engine_config.model)
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None

    if torch_threads < 0:
        raise typer.BadParameter(f"must be >= 0, got {torch_threads}", param_hint="--torch-threads")
    for path, flag in (
        (record_steps, "--record-steps"),
        (record_requests, "--record-requests"),
        (record_decisions, "--record-decisions"),
    ):
        if path is not None:
            _check_writable(path, flag)
    if trace_file is not None:
        _check_writable(trace_file, "--trace-file")
    if otlp_traces_endpoint is not None and not otlp_traces_endpoint.startswith(
        ("http://", "https://")
    ):
        raise typer.BadParameter(
            f"expected an http(s) URL, got {otlp_traces_endpoint!r}",
            param_hint="--otlp-traces-endpoint",
        )
    from engine.telemetry.tracing import resolve_tracing

    tracing = resolve_tracing(
        trace_file,
        otlp_traces_endpoint,
        no_tracing,
        model_name=settings.served_model_name,
    )
    if engine_core not in ENGINE_CORES:
        raise typer.BadParameter(
            f"expected one of {', '.join(ENGINE_CORES)}, got {engine_core!r}",
            param_hint="--engine-core",
        )
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    threads = (torch_threads or serving_torch_threads()) if executor == "torch" else 0
    if threads:
        log.info("torch intra-op threads: %d of %d cores", threads, os.cpu_count() or 1)
    log.info("tracing: %s", _describe_tracing(tracing))
    raise_open_file_limit()
    if engine_core == "process":
        return _serve_with_engine_process(
            engine_config,
            executor,
            model,
            threads,
            record_steps,
            record_requests,
            tokenizer,
            settings,
            tracing,
            record_decisions,
        )
    return _serve_with_engine_thread(
        engine_config,
        executor,
        model,
        threads,
        record_steps,
        record_requests,
        tokenizer,
        settings,
        tracing,
        record_decisions,
    )


def _describe_tracing(tracing) -> str:
    if tracing is None:
        return "off (--trace-file or --otlp-traces-endpoint / OTEL_EXPORTER_OTLP_* turn it on)"
    where = []
    if tracing.trace_file is not None:
        where.append(f"file {tracing.trace_file}")
    if tracing.otlp_endpoint is not None:
        where.append(f"OTLP/HTTP {tracing.otlp_endpoint}")
    elif tracing.otlp_from_env:
        where.append("OTLP/HTTP (OTEL_EXPORTER_OTLP_* endpoint)")
    return ", ".join(where)


def raise_open_file_limit(target: int = 65536) -> None:
    """Raise the soft open-file limit toward the hard one (as vLLM's server does): each
    connection holds a descriptor, and the server caps connections below the limit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, OSError, ValueError) as exc:  # pragma: no cover - not POSIX
        log.warning("could not raise the open-file limit: %s", exc)


def _check_writable(path: Path, flag: str) -> None:
    """A path that cannot take its file is refused now, not found out after the whole
    run; so are the parts of a record file a crashed run left (they would be merged
    into this run's file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot create {path.parent}: {exc.strerror}", param_hint=flag
        ) from None
    if (
        path.is_dir()
        or not os.access(path.parent, os.W_OK)
        or (path.exists() and not os.access(path, os.W_OK))
    ):
        raise typer.BadParameter(f"cannot write {path}", param_hint=flag)
    leftover = parts_dir(path)
    if leftover.exists():
        # Its parts would be merged into this run's file: a crashed run's rows, mixed in.
        raise typer.BadParameter(
            f"{leftover} holds the records of a run that did not finish; recover them "
            f"with `schedscope recover-records {path}` (or delete that folder) first",
            param_hint=flag,
        )


def _serve_with_engine_process(
    engine_config,
    executor,
    model,
    threads,
    record_steps,
    record_requests,
    tokenizer,
    settings,
    tracing=None,
    record_decisions=None,
) -> int:
    from engine.serving.engine_core import EngineCoreSpec
    from engine.serving.process_engine import EngineProcessError, ProcessEngine

    spec = EngineCoreSpec(
        engine_config,
        executor,
        model.to_dict() if model else None,
        threads,
        record_writers=record_writer_specs(record_steps, record_requests, record_decisions),
        tracing=tracing,
        metrics_model_name=settings.served_model_name if settings.metrics else None,
    )
    engine = ProcessEngine(spec)
    try:
        engine.launch()
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    except EngineProcessError as exc:
        log.error("%s", exc)
        return 1
    log.info("%s executor, model %s, in the engine process", executor, engine_config.model)
    code = _serve(engine, tokenizer, settings)
    # The engine process wrote the records and reported what it could not write.
    return _exit_code(code, spec.record_writers, engine.lost_records)


def _serve_with_engine_thread(
    engine_config,
    executor,
    model,
    threads,
    record_steps,
    record_requests,
    tokenizer,
    settings,
    tracing=None,
    record_decisions=None,
) -> int:
    from engine.records.writers import install_record_writers, write_records
    from engine.serving.async_engine import AsyncEngine

    if threads:
        import torch

        torch.set_num_threads(threads)  # global: the engine thread's forward passes use it
    try:
        llm_engine = build_engine(engine_config, executor, cost_model=model)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    log.info(
        "%s executor, model %s; %s",
        executor,
        engine_config.model,
        llm_engine.kv_plan.describe(engine_config.cache.block_size),
    )
    if settings.metrics:
        from engine.telemetry.metrics import install_metrics

        install_metrics(llm_engine, settings.served_model_name)
    writers = install_record_writers(
        llm_engine.observers,
        engine_config,
        record_writer_specs(record_steps, record_requests, record_decisions),
    )
    async_engine = AsyncEngine(llm_engine)
    traced = None
    if tracing is not None:
        from engine.telemetry.tracing import install_tracing

        # after the stream delivery observer: tokens leave before spans are made
        traced = install_tracing(llm_engine, tracing)
        from engine.serving.engine_core import publish_dropped_spans

        publish_dropped_spans(llm_engine, traced)
    lost: list[LostRecord] | None = None
    try:
        code = _serve(async_engine, tokenizer, settings)
    finally:
        try:
            if traced is not None:
                from engine.serving.engine_core import shutdown_tracing

                shutdown_tracing(traced)
        finally:  # the records are written whatever the span flush did
            lost = write_records(writers)
    return _exit_code(code, tuple(w.spec for w in writers), lost)


def _serve(engine, tokenizer, settings) -> int:
    """The HTTP server until shutdown: its exit code, 1 when it cannot bind."""
    from engine.api import run_server

    try:
        return run_server(engine, tokenizer, settings)
    except OSError as exc:  # the address is taken, or not ours to bind
        log.error("cannot serve on %s:%d: %s", settings.host, settings.port, exc)
        return 1


def _exit_code(
    code: int, specs: tuple[RecordWriterSpec, ...], lost: list[LostRecord] | None
) -> int:
    """The server's exit code, made non-zero when a record file was lost: one that could
    not be written (``lost``, each already logged with its error where it failed), or
    every one when the engine stopped without reporting them (``lost`` None: a killed
    or dead engine process)."""
    if not specs:
        return code
    if lost is None:
        recovered = [_recover_after_crash(spec) for spec in specs]
        if not all(recovered):
            log.error(
                "the engine stopped without writing its records; not written: %s",
                ", ".join(
                    f"{spec.name} ({spec.path})"
                    for spec, done in zip(specs, recovered, strict=True)
                    if not done
                ),
            )
        return code or 1
    if lost:
        log.error(
            "%d of %d record files not written: %s",
            len(lost),
            len(specs),
            "; ".join(item.describe() for item in lost),
        )
        return code or 1
    return code


def _recover_after_crash(spec: RecordWriterSpec) -> bool:
    """The engine process died before writing ``spec``'s file: merge the parts it wrote
    as it ran. True when the file holds them (every row up to the last flush)."""
    try:
        num_rows = recover_record_file(spec.path)
    except Exception as exc:
        log.error("could not recover %s into %s: %s", spec.name, spec.path, exc)
        return False
    if num_rows is None:
        return False
    log.error(
        "the engine stopped without closing its records: %s (%s) holds the %d rows written "
        "up to its last flush; rows of the last %.0f s before the engine stopped are lost",
        spec.name,
        spec.path,
        num_rows,
        FLUSH_INTERVAL_S,
    )
    return True


def _step_log(path: Path, config: EngineConfig) -> IncrementalRecordWriter:
    return IncrementalRecordWriter(StepLog(), path, STEP_SCHEMA)


def _request_log(path: Path, config: EngineConfig) -> IncrementalRecordWriter:
    recorder = RequestRecorder(config.scheduler.scheduling_policy, "served")
    return IncrementalRecordWriter(recorder, path, REQUEST_SCHEMA)


def _decision_log(path: Path, config: EngineConfig) -> IncrementalRecordWriter:
    return IncrementalRecordWriter(DecisionLog(), path, DECISION_SCHEMA)


def record_writer_specs(
    record_steps: Path | None, record_requests: Path | None, record_decisions: Path | None
) -> tuple[RecordWriterSpec, ...]:
    """The engine's record writers for ``--record-steps``, ``--record-requests`` and
    ``--record-decisions``: each writes its file as the engine runs
    (:mod:`harness.records.incremental`). The factories are module-level functions
    bound to their path: the engine process unpickles them."""
    chosen = (
        (record_steps, _step_log, "step records"),
        (record_requests, _request_log, "request records"),
        (record_decisions, _decision_log, "decisions"),
    )
    return tuple(
        RecordWriterSpec(partial(make, path), path, name)
        for path, make, name in chosen
        if path is not None
    )
