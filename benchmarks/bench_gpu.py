"""The engine at GPU size: decode tokens/s of the 8B-shaped preset at batch 1, 32 and 256
(eager, through CUDA graphs, and torch.compile's speed-up), each step against the
memory-bandwidth floor, the swap copies' bandwidth, and the KV pool the memory knobs
give. On the CPU the same figures for the `tiny` preset (no graphs, no compile, no
floor: the CPU counterpart).

The floor of a decode step: it must read every weight once and every sequence's K/V
once, so no step is faster than (weight bytes + batch x context x KV bytes per token)
/ the device's memory bandwidth (--peak-tbs; the H200's datasheet gives 4.8 TB/s).
"x floor" is a step's time over that floor. A device-to-device copy is also timed
(bytes read + written over time): the bandwidth this device really reaches.

torch.compile's figure: compiled / eager time of the same decode step; under --quick
on the first --compile-layers layers of the model only (compiling 32 layers takes
minutes), on the full model otherwise. A compile that fails is reported, not fatal.

No targets: these figures say where the device stands (docs/execution.md).

Run: .venv/bin/python benchmarks/bench_gpu.py [--model llama3-8b|tiny] [--context 1024]
     [--device cpu|cuda] [--quick] [--json FILE]
"""

from __future__ import annotations

import dataclasses
import time

import torch

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.worker.attention_metadata import AttentionMetadata, allocate_kv_cache
from engine.worker.decode_graphs import DecodeGraphs
from engine.worker.loading import prepare_torch_runner
from engine.worker.model import build_model
from engine.worker.model_config import ModelConfig
from engine.worker.swap_copies import SwapCopier
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.bench.timing import median_seconds

BLOCK = 16
BATCHES = (1, 32, 256)
SWAP_BLOCKS = 256


class DecodeBatch:
    """``batch`` sequences of ``context`` tokens each on shuffled blocks of one cache
    (one block more: the graphs' scratch block); a step decodes one token each."""

    def __init__(self, model, config: ModelConfig, batch: int, context: int, device: str):
        self.model = model
        self.device = device
        blocks_per_seq = -(-(context + 1) // BLOCK)
        self.num_blocks = batch * blocks_per_seq
        self.cache = allocate_kv_cache(config, self.num_blocks + 1, BLOCK, device)
        ids = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(0))
        self.tables = ids.view(batch, blocks_per_seq).tolist()
        self.seq_lens = [context + 1] * batch
        self.tokens = torch.randint(3, config.vocab_size, (batch,)).tolist()

    def eager_step(self) -> torch.Tensor:
        """What the runner does for a decode step without graphs: metadata, forward."""
        metadata, positions = AttentionMetadata.build(
            [1] * len(self.tokens), self.seq_lens, self.tables, BLOCK, self.device
        )
        tokens = torch.tensor(self.tokens, device=self.device)
        return self.model(tokens, positions, self.cache, metadata)

    def graphs(self, max_batch: int, context: int) -> DecodeGraphs:
        graphs = DecodeGraphs(
            self.model,
            self.cache,
            BLOCK,
            self.num_blocks,
            max_batch,
            context + 1,
            torch.device(self.device),
            capture=True,
        )
        return graphs


def decode_times(
    model, config: ModelConfig, size: int, context: int, repeats: int, device: str
) -> tuple[float, float | None]:
    """Median seconds of a decode step of ``size`` sequences: eager, and replayed from
    a captured CUDA graph (None off CUDA)."""
    batch = DecodeBatch(model, config, size, context, device)
    eager = median_seconds(batch.eager_step, repeats, device, warm_ups=2)
    graph = None
    if device == "cuda":
        graphs = batch.graphs(size, context)
        graph = median_seconds(
            lambda: graphs.run(batch.tokens, batch.seq_lens, batch.tables),
            repeats,
            device,
            warm_ups=2,
        )
    return eager, graph  # the batch's cache is freed on return


def floor_s(config: ModelConfig, batch: int, context: int, peak_bytes_s: float) -> float:
    """Seconds to read every weight and every sequence's K/V once at ``peak_bytes_s``."""
    return (config.weights_bytes + batch * context * config.kv_bytes_per_token()) / peak_bytes_s


def copy_bandwidth(device: str, repeats: int) -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy."""
    source = torch.empty(1 << 28, dtype=torch.float32, device=device).normal_()
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), repeats, device, warm_ups=2)
    return 2 * source.numel() * 4 / seconds


def swap_bandwidth(config: ModelConfig, device: str, repeats: int) -> tuple[float, float]:
    """Bytes per second of swapping ``SWAP_BLOCKS`` blocks out (device -> host) and in."""
    device_cache = allocate_kv_cache(config, SWAP_BLOCKS, BLOCK, device)
    host_cache = allocate_kv_cache(config, SWAP_BLOCKS, BLOCK, "cpu", pin_memory=device == "cuda")
    swaps = SwapCopier(device_cache, host_cache, torch.device(device))
    mapping = [(i, SWAP_BLOCKS - 1 - i) for i in range(SWAP_BLOCKS)]

    def out() -> None:
        swaps.swap_out(mapping)
        swaps.finish()

    out_s = median_seconds(out, repeats, device, warm_ups=2)
    in_s = median_seconds(lambda: swaps.swap_in(mapping), repeats, device, warm_ups=2)
    moved = SWAP_BLOCKS * config.kv_bytes_per_block(BLOCK)
    return moved / out_s, moved / in_s


def compile_ratio(config: ModelConfig, args, device: str) -> tuple[float | None, str]:
    """compiled / eager seconds of one decode step at batch 32; None and why on failure."""
    layers = args.compile_layers if args.quick else config.num_layers
    small = dataclasses.replace(config, num_layers=min(layers, config.num_layers))
    model = build_model(small, device)
    batch = DecodeBatch(model, small, 32, args.context, device)
    metadata, positions = AttentionMetadata.build(
        [1] * 32, batch.seq_lens, batch.tables, BLOCK, device
    )
    tokens = torch.tensor(batch.tokens, device=device)
    note = f"batch 32, {small.num_layers} of {config.num_layers} layers"
    try:
        eager = median_seconds(
            lambda: model.last_hidden(tokens, positions, batch.cache, metadata),
            5,
            device,
            warm_ups=2,
        )
        compiled_fn = torch.compile(model.last_hidden, dynamic=False)
        started = time.perf_counter()
        compiled_fn(tokens, positions, batch.cache, metadata)
        compile_s = time.perf_counter() - started
        compiled = median_seconds(
            lambda: compiled_fn(tokens, positions, batch.cache, metadata), 5, device, warm_ups=2
        )
    except Exception as exc:  # noqa: BLE001 - a failed compile is a finding, not a crash
        return None, f"{note}: torch.compile failed: {type(exc).__name__}: {exc}"[:300]
    print(
        f"torch.compile ({note}): eager {eager * 1e3:.2f} ms, compiled {compiled * 1e3:.2f} ms "
        f"({compile_s:.0f} s to compile)"
    )
    return compiled / eager, f"{note}; {compile_s:.0f} s to compile"


def kv_pool(model, config: ModelConfig, device: str) -> tuple[int, float]:
    """Device blocks and GiB the default memory knobs give this model on ``device``."""
    engine_config = EngineConfig(SchedulerConfig(), CacheConfig(swap_space=0.0), model=config.name)
    prepared = prepare_torch_runner(engine_config, device, model=model, warm_up=False)
    blocks = prepared.kv_plan.num_device_blocks
    del prepared
    if device == "cuda":
        torch.cuda.empty_cache()
    return blocks, blocks * config.kv_bytes_per_block(BLOCK) / (1 << 30)


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--model", default=None, help="default llama3-8b on cuda, tiny on cpu")
    parser.sized("--context", type=int, full=1024, quick=512)
    parser.sized("--repeats", type=int, full=20, quick=5)
    parser.add_argument("--peak-tbs", type=float, default=4.8, help="memory bandwidth, TB/s")
    parser.add_argument("--compile-layers", type=int, default=4)
    parser.add_device()
    return parser


def run(args) -> list[Figure]:
    device = args.device
    cuda = device == "cuda"
    config = ModelConfig.preset(args.model or ("llama3-8b" if cuda else "tiny"))
    model = build_model(config, device)
    context = args.context
    print(
        f"model {config.name}: {config.num_parameters / 1e9:.2f} B parameters in {config.dtype}"
        f" ({config.weights_bytes / 1e9:.1f} GB), context {context}, on {device}"
    )
    figures: list[Figure] = []
    peak = args.peak_tbs * 1e12
    if cuda:
        measured = copy_bandwidth(device, args.repeats)
        print(f"device copy: {measured / 1e12:.2f} TB/s, read + written")
        figures.append(Figure("device copy bandwidth", measured / 1e12, "TB/s", better="higher"))
    header = f"{'batch':>6} {'eager ms':>9} {'graph ms':>9} {'floor ms':>9} {'x floor':>8}"
    print(f"{header} {'tok/s':>10}")
    with torch.inference_mode():
        for size in BATCHES:
            eager, graph = decode_times(model, config, size, context, args.repeats, device)
            if cuda:
                torch.cuda.empty_cache()  # the last batch's cache before the next one's
            best = min(eager, graph) if graph is not None else eager
            floor = floor_s(config, size, context, peak)
            graph_ms = f"{graph * 1e3:9.2f}" if graph is not None else f"{'-':>9}"
            floor_ms = f"{floor * 1e3:9.3f}" if cuda else f"{'-':>9}"
            over = f"{best / floor:8.2f}" if cuda else f"{'-':>8}"
            print(f"{size:>6} {eager * 1e3:9.2f} {graph_ms} {floor_ms} {over} {size / best:10,.0f}")
            note = f"context {context}, on {device}"
            figures.append(
                Figure(
                    f"decode tokens/s at batch {size}, eager",
                    size / eager,
                    "tokens/s",
                    better="higher",
                    note=note,
                )
            )
            if graph is not None:
                figures.append(
                    Figure(
                        f"decode tokens/s at batch {size}, CUDA graphs",
                        size / graph,
                        "tokens/s",
                        better="higher",
                        note=note,
                    )
                )
                figures.append(
                    Figure(
                        f"decode step at batch {size} over the bandwidth floor",
                        best / floor,
                        "x",
                        note=f"{note}; floor {floor * 1e3:.2f} ms at {args.peak_tbs} TB/s",
                    )
                )
        if cuda:
            ratio, note = compile_ratio(config, args, device)
            figures.append(Figure("torch.compile / eager decode step", ratio, "x", note=note))
        else:
            print("torch.compile: not measured on the cpu (the GPU's question)")
        out_bw, in_bw = swap_bandwidth(config, device, args.repeats)
        print(f"swap copies: out {out_bw / 1e9:.2f} GB/s, in {in_bw / 1e9:.2f} GB/s")
        note = f"{SWAP_BLOCKS} blocks of {BLOCK} tokens, on {device}"
        figures.append(
            Figure("swap-out bandwidth", out_bw / 1e9, "GB/s", better="higher", note=note)
        )
        figures.append(Figure("swap-in bandwidth", in_bw / 1e9, "GB/s", better="higher", note=note))
    blocks, gib = kv_pool(model, config, device)
    tokens = blocks * BLOCK
    print(f"KV pool at the default knobs: {blocks} blocks, {tokens:,} tokens, {gib:.1f} GiB")
    figures.append(
        Figure(
            "KV pool tokens at --gpu-memory-utilization 0.9",
            float(tokens),
            "tokens",
            better="higher",
            note=f"{gib:.1f} GiB, {config.kv_bytes_per_token() // 1024} KiB per token, on {device}",
        )
    )
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
