"""What Prometheus metrics cost the engine (engine/telemetry/metrics.py).

1. Per observation: a counter increment, a histogram observe (with and without an
   exemplar), and one inter-token gap through the bulk ITL collector.
2. Per step: the metrics observer's own time, measured around the observer, in a
   steady decode at batch 32 (torch executor, tiny model, CPU), beside the step's time
   with metrics off and on (interleaved rounds, medians). Target: the observer costs
   at most 1% of a torch step at batch 32.
3. One render of /metrics (text and OpenMetrics).

Run: .venv/bin/python benchmarks/bench_telemetry_metrics.py [--steps 200] [--batch 32]
     [--quick: 50 steps, 50,000 observations] [--json FILE]
"""

from __future__ import annotations

import statistics
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.telemetry.metrics import ITL_BUCKETS, TTFT_BUCKETS, _BulkHistogram, install_metrics
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

TARGET_FRACTION = 0.01


def per_observation(n: int = 200_000) -> dict[str, float]:
    reg = CollectorRegistry()
    counter = Counter("c", "", ["a"], registry=reg).labels("x")
    hist = Histogram("h", "", ["a"], buckets=TTFT_BUCKETS, registry=reg).labels("x")
    bulk = _BulkHistogram([("b", "")], ITL_BUCKETS, ["a"], ["x"])
    exemplar = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    values = [0.001 * (i % 300) for i in range(n)]
    out = {}
    t = time.perf_counter()
    for _ in range(n):
        counter.inc()
    out["counter inc"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for v in values:
        hist.observe(v)
    out["histogram observe"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for v in values:
        hist.observe(v, exemplar)
    out["histogram observe + exemplar"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for i in range(0, n, 32):
        bulk.observe_many(values[i : i + 32])
    out["bulk ITL per gap (32 a step)"] = (time.perf_counter() - t) / n
    return out


class Timed:
    """Wraps an observer and sums its own time."""

    def __init__(self, observer) -> None:
        self.observer = observer
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, record) -> None:
        t = time.perf_counter()
        self.observer(record)
        self.seconds += time.perf_counter() - t
        self.calls += 1


def torch_engine(batch: int):
    from engine.core.clock import WallClock
    from engine.factory import build_torch_engine

    config = EngineConfig(
        SchedulerConfig(max_num_seqs=batch, max_model_len=2048),
        CacheConfig(block_size=16, num_gpu_blocks_override=2048, num_cpu_blocks_override=0),
        model="tiny",
    )
    return build_torch_engine(config, WallClock(), device="cpu")


def fill(engine, batch: int, tag: str, max_tokens: int) -> None:
    for i in range(batch):
        engine.add_request(
            EngineRequest(
                f"{tag}{i}",
                list(range(10, 42)),
                SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            )
        )
    while any(
        s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.requests.values()
    ):
        engine.step()  # prefills: not measured


def per_step(steps: int, batch: int, rounds: int = 5) -> list[Figure]:
    import torch

    torch.set_num_threads(2)
    engine = torch_engine(batch)
    metrics = install_metrics(engine, "tiny")
    engine.observers.remove(metrics)
    timed = Timed(metrics)
    on_times, off_times = [], []
    for r in range(rounds):
        for enabled in (False, True) if r % 2 == 0 else (True, False):
            if enabled:
                engine.observers.add(timed)
            fill(engine, batch, f"r{r}{int(enabled)}-", steps + 2)
            start_calls = timed.calls
            times = []
            for _ in range(steps):
                t = time.perf_counter()
                record = engine.step()
                times.append(time.perf_counter() - t)
                assert record.num_decode_seqs == batch, record.num_decode_seqs
            (on_times if enabled else off_times).extend(times)
            if enabled:
                engine.observers.remove(timed)
            for rid in list(engine.scheduler.requests):
                engine.abort(rid)
            engine.step()
            assert timed.calls >= start_calls
    step_off = statistics.median(off_times)
    step_on = statistics.median(on_times)
    observer = timed.seconds / timed.calls
    print(
        f"torch decode step at batch {batch} ({len(off_times)} steps each): "
        f"metrics off {step_off * 1e3:.3f} ms, on {step_on * 1e3:.3f} ms "
        f"(on/off {step_on / step_off:.4f}; step-to-step noise dominates this)"
    )
    fraction = observer / step_off
    verdict = "OK" if fraction <= TARGET_FRACTION else "OVER TARGET"
    print(
        f"metrics observer: {observer * 1e6:.1f} us per step = {fraction * 100:.3f}% of a "
        f"step (target <= {TARGET_FRACTION * 100:.0f}%): {verdict}"
    )
    body_t = time.perf_counter()
    for _ in range(20):
        text, _ = metrics.render()
    text_s = (time.perf_counter() - body_t) / 20
    body_t = time.perf_counter()
    for _ in range(20):
        om, _ = metrics.render("application/openmetrics-text;version=1.0.0")
    om_s = (time.perf_counter() - body_t) / 20
    print(
        f"render /metrics: text {text_s * 1e3:.2f} ms ({len(text)} bytes), "
        f"OpenMetrics {om_s * 1e3:.2f} ms ({len(om)} bytes)"
    )
    return [
        Figure(
            f"metrics observer, share of a torch step at batch {batch}",
            fraction * 100,
            "%",
            TARGET_FRACTION * 100,
            note=f"{observer * 1e6:.1f} us of a {step_off * 1e3:.3f} ms step",
        ),
        Figure("render /metrics, text", text_s * 1e3, "ms", note=f"{len(text)} bytes"),
        Figure("render /metrics, OpenMetrics", om_s * 1e3, "ms", note=f"{len(om)} bytes"),
    ]


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--steps", type=int, full=200, quick=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.sized("--observations", type=int, full=200_000, quick=50_000)
    return parser


def run(args) -> list[Figure]:
    figures = []
    for name, seconds in per_observation(args.observations).items():
        print(f"{name:32s} {seconds * 1e6:7.3f} us")
        figures.append(Figure(f"per observation: {name}", seconds * 1e6, "us"))
    return [*per_step(args.steps, args.batch), *figures]


if __name__ == "__main__":
    bench_main(parser, run)
