"""The bundled model on this device: decode tokens/s by batch, prefill tokens/s, and the
cost of paging (decode over the paged KV cache vs a dense contiguous cache).

Targets: paged decode at batch 64 <= 1.3x the dense step. The throughput figures have
no target: they show where the device saturates.

Run: .venv/bin/python benchmarks/bench_model.py [--model tiny] [--context 256]
     [--device cpu|cuda] [--quick: 5 repeats] [--json FILE]
"""

from __future__ import annotations

import torch

from engine.worker.dense_reference import DenseKVCache, dense_decode_forward
from engine.worker.model import AttentionMetadata, allocate_kv_cache, build_model
from engine.worker.model_config import ModelConfig
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.bench.timing import median_seconds

BLOCK = 16
PAGING_TARGET = 1.3


def paged_decode(model, config, batch: int, context: int, device: str, shuffled: bool = True):
    blocks_per_seq = -(-(context + 1) // BLOCK)
    num_blocks = batch * blocks_per_seq
    cache = allocate_kv_cache(config, num_blocks, BLOCK, device)
    ids = (
        torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
        if shuffled
        else torch.arange(num_blocks)
    )
    tables = ids.view(batch, blocks_per_seq).tolist()
    metadata, positions = AttentionMetadata.build(
        [1] * batch, [context + 1] * batch, tables, BLOCK, device
    )
    tokens = torch.randint(3, config.vocab_size, (batch,), device=device)
    return lambda: model(tokens, positions, cache, metadata)


def dense_decode(model, config, batch: int, context: int, device: str):
    cache = DenseKVCache(config, batch, context + 1, device)
    positions = torch.full((batch,), context, dtype=torch.long, device=device)
    tokens = torch.randint(3, config.vocab_size, (batch,), device=device)
    return lambda: dense_decode_forward(model, tokens, positions, cache)


def prefill(model, config, num_tokens: int, device: str):
    num_blocks = -(-num_tokens // BLOCK)
    cache = allocate_kv_cache(config, num_blocks, BLOCK, device)
    metadata, positions = AttentionMetadata.build(
        [num_tokens], [num_tokens], [list(range(num_blocks))], BLOCK, device
    )
    tokens = torch.randint(3, config.vocab_size, (num_tokens,), device=device)
    return lambda: model(tokens, positions, cache, metadata)


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--context", type=int, default=256)
    parser.sized("--repeats", type=int, full=30, quick=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_device()
    return parser


def run(args) -> list[Figure]:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    config = ModelConfig.preset(args.model)
    model = build_model(config, device)
    print(
        f"model {config.name}: {config.num_parameters / 1e6:.1f}M parameters, "
        f"{torch.get_num_threads()} threads, context {args.context}, on {device}"
    )
    figures = []
    with torch.inference_mode():
        print(f"{'batch':>6} {'paged ms':>9} {'dense ms':>9} {'ratio':>6} {'decode tok/s':>13}")
        ratio_64 = None
        for batch in (1, 8, 32, 64):
            paged = median_seconds(
                paged_decode(model, config, batch, args.context, device), args.repeats, device
            )
            dense = median_seconds(
                dense_decode(model, config, batch, args.context, device), args.repeats, device
            )
            ratio = paged / dense
            if batch == 64:
                ratio_64 = ratio
            print(
                f"{batch:>6} {paged * 1e3:9.2f} {dense * 1e3:9.2f} {ratio:6.2f} "
                f"{batch / paged:13,.0f}"
            )
            figures.append(Figure(f"decode tokens/s at batch {batch}", batch / paged, "tokens/s"))
        for tokens in (128, 512, 2048):
            t = median_seconds(
                prefill(model, config, tokens, device), max(5, args.repeats // 3), device
            )
            print(f"prefill {tokens:>5} tokens: {t * 1e3:8.2f} ms  {tokens / t:10,.0f} tokens/s")
            figures.append(
                Figure(f"prefill tokens/s, {tokens}-token prompt", tokens / t, "tokens/s")
            )
    verdict = "MET" if ratio_64 <= PAGING_TARGET else "MISSED"
    print(f"paging overhead at batch 64: {ratio_64:.2f}x   target <= {PAGING_TARGET}x   {verdict}")
    note = f"paged / dense decode step, context {args.context}, on {device}"
    return [
        Figure("paging overhead at batch 64", ratio_64, "x", PAGING_TARGET, note=note),
        *figures,
    ]


if __name__ == "__main__":
    bench_main(parser, run)
