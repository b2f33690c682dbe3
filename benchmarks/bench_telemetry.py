"""Full telemetry on vs off: spans (to an OTLP-JSON file) and Prometheus metrics,
against the same engine without them.

Two torch engines (tiny model, CPU), one with ``install_metrics`` and
``install_tracing``, one bare, run alternating rounds of the same closed batch: 32
requests of a 32-token prompt and 64 output tokens each, from admission to the last
token (prefills, decodes, finishes: every kind of span and observation a request
makes). Throughput is output tokens per second of engine time; the figure is the
ratio of medians over the rounds, measured in one run, so machine noise hits both
sides alike. Also printed: spans per round, dropped spans, the exporter's totals.

Target: throughput with telemetry >= 97% of without (aim >= 99%).

Run: .venv/bin/python benchmarks/bench_telemetry.py [--rounds 6] [--batch 32] [--tokens 64]
     [--quick: 2 rounds] [--json FILE]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench_telemetry_metrics import torch_engine  # the same engine: run from benchmarks/

from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

TARGET = 0.97
AIM = 0.99


def one_round(engine, tag: str, batch: int, tokens: int) -> float:
    """Output tokens per second for one closed batch, admission to last token."""
    for i in range(batch):
        engine.add_request(
            EngineRequest(
                f"{tag}-{i}",
                list(range(10, 42)),
                SamplingParams(max_tokens=tokens, ignore_eos=True),
                request_class="bench",
            )
        )
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return batch * tokens / (time.perf_counter() - started)


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--rounds", type=int, full=6, quick=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="0: what schedscope serve uses (one fewer than the cores)",
    )
    return parser


def run(args) -> list[Figure]:
    if not args.torch_threads:
        from harness.costmodel.machine import serving_torch_threads

        args.torch_threads = serving_torch_threads()

    import torch

    from engine.telemetry.metrics import install_metrics
    from engine.telemetry.tracing import TracingSettings, install_tracing

    torch.set_num_threads(args.torch_threads)
    bare = torch_engine(args.batch)
    instrumented = torch_engine(args.batch)
    metrics = install_metrics(instrumented, "tiny")
    trace_file = Path(tempfile.mkdtemp(prefix="schedscope-bench-")) / "spans.jsonl"
    tracing = install_tracing(
        instrumented, TracingSettings(trace_file=trace_file, model_name="tiny")
    )
    metrics.watch_dropped_spans(lambda: tracing.num_dropped_spans)

    one_round(bare, "warm", args.batch, 8)  # first-call costs out of the measurement
    one_round(instrumented, "warm", args.batch, 8)
    off, on = [], []
    for r in range(args.rounds):
        # Alternate which goes first, so a drift in machine load favours neither.
        pair = [(bare, off), (instrumented, on)]
        for engine, results in pair if r % 2 == 0 else pair[::-1]:
            results.append(one_round(engine, f"r{r}", args.batch, args.tokens))
    stats = tracing.shutdown()
    ratio = statistics.median(on) / statistics.median(off)
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(
        f"torch tiny, batch {args.batch}, {args.tokens} output tokens, {args.rounds} "
        f"alternating rounds, {args.torch_threads} torch threads"
    )
    print(
        f"  without telemetry: {statistics.median(off):8.0f} tokens/s "
        f"(rounds {', '.join(f'{x:.0f}' for x in off)})"
    )
    print(
        f"  with spans+metrics: {statistics.median(on):7.0f} tokens/s "
        f"(rounds {', '.join(f'{x:.0f}' for x in on)})"
    )
    print(f"  ratio {ratio:.3f}   target >= {TARGET:.2f} ({verdict}), aim >= {AIM:.2f}")
    print(
        f"  spans: {stats['spans']} ended, {stats['exported_spans']} exported, "
        f"{stats['dropped_spans']} dropped; trace file {trace_file.stat().st_size / 1e6:.1f} MB"
    )
    return [
        Figure(
            "throughput with spans+metrics / without",
            ratio,
            "x",
            TARGET,
            "higher",
            AIM,
            note=f"median of {args.rounds} alternating rounds, batch {args.batch}; "
            f"{stats['dropped_spans']} spans dropped",
        ),
        Figure("spans dropped", stats["dropped_spans"], "spans", note=f"of {stats['spans']}"),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
