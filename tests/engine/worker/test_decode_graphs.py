"""Decode steps through padded shapes (engine/worker/decode_graphs.py), on the device
under test: eagerly on the CPU (the logic of the padding and the scratch block), as
captured CUDA graphs under gpu.sh. Each must give the logits of the unpadded step, and
greedy generation through an engine must give the same tokens with graphs as without."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.config import CacheConfig, EngineConfig, ExecutionConfig, SchedulerConfig
from engine.core.clock import VirtualClock
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.factory import build_torch_engine
from engine.worker.decode_graphs import BATCH_SIZES, DecodeGraphs, padded_batch_sizes
from engine.worker.model import AttentionMetadata, allocate_kv_cache, build_model
from engine.worker.model_config import ModelConfig
from engine.worker.model_runner import ModelRunner
from tests.support.device import device_under_test

pytestmark = [pytest.mark.torch_model]

MODEL = ModelConfig(
    name="graphs",
    vocab_size=300,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    seed=4,
)
BLOCK = 4
NUM_BLOCKS = 160  # the pool; block NUM_BLOCKS is the scratch block


@pytest.fixture(scope="module")
def model():
    device = device_under_test()
    model = build_model(MODEL, device)
    with torch.no_grad():  # peaked attention, so a wrong mask or slot shows in the logits
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
    return model


def filled_cache(device: str):
    cache = allocate_kv_cache(MODEL, NUM_BLOCKS + 1, BLOCK, device)
    generator = torch.Generator().manual_seed(1)
    for k, v in cache:
        k[:NUM_BLOCKS].copy_(torch.randn(k[:NUM_BLOCKS].shape, generator=generator))
        v[:NUM_BLOCKS].copy_(torch.randn(v[:NUM_BLOCKS].shape, generator=generator))
    return cache


def graphs_over(model, cache, max_batch=8, max_context=64) -> DecodeGraphs:
    device = model.device
    return DecodeGraphs(
        model, cache, BLOCK, NUM_BLOCKS, max_batch, max_context, device, device.type == "cuda"
    )


@pytest.mark.parametrize("seq_lens", [[1], [5, 9, 3], [17, 2, 33, 8, 12], [64] * 8])
def test_a_padded_decode_gives_the_unpadded_step_s_logits_and_writes_only_its_slots(
    model, seq_lens
):
    device = model.device
    rng = np.random.default_rng(len(seq_lens))
    ids = rng.permutation(NUM_BLOCKS).tolist()
    tables = [ids[16 * s : 16 * s + 16] for s in range(len(seq_lens))]
    tokens = rng.integers(3, MODEL.vocab_size, len(seq_lens)).tolist()

    reference_cache = filled_cache(device.type)
    meta, positions = AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, BLOCK, device)
    expected = model(torch.tensor(tokens, device=device), positions, reference_cache, meta)

    cache = filled_cache(device.type)
    graphs = graphs_over(model, cache)
    actual = graphs.run(tokens, seq_lens, tables)
    assert actual is not None and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    untouched = filled_cache(device.type)
    written = meta.slot_mapping.cpu()
    for (k, v), (rk, rv), (k0, v0) in zip(cache, reference_cache, untouched, strict=True):
        for new, ref, old in ((k, rk, k0), (v, rv, v0)):
            new, ref, old = (t[:NUM_BLOCKS].flatten(0, 1).cpu() for t in (new, ref, old))
            # each real row wrote its one slot, as the unpadded step did ...
            torch.testing.assert_close(new[written], ref[written], rtol=1e-4, atol=1e-4)
            # ... and nothing else of the pool changed: padding rows wrote the scratch block
            new[written] = old[written]
            assert torch.equal(new, old)
    if device.type == "cuda":
        assert graphs.num_replays == 1


def test_a_step_larger_than_every_shape_is_left_to_the_eager_path(model):
    graphs = graphs_over(model, filled_cache(model.device.type), max_batch=4, max_context=16)
    assert graphs.run([3] * 5, [4] * 5, [[0]] * 5) is None  # batch 5 > 4
    assert graphs.run([3], [17], [[0, 1, 2, 3, 4]]) is None  # 17 tokens > 16


@given(num_seqs=st.integers(1, 300), max_seq_len=st.integers(1, 3000))
def test_a_shape_holds_its_step_and_is_the_smallest_that_does(num_seqs, max_seq_len):
    graphs = DecodeGraphs(
        None, [], 16, 0, max_batch=256, max_context=2048, device=torch.device("cpu"), capture=False
    )
    key = graphs.shape_for(num_seqs, max_seq_len)
    blocks_needed = -(-max_seq_len // 16)
    if num_seqs > 256 or blocks_needed > 128:
        assert key is None
        return
    assert key is not None
    batch, blocks = key
    assert batch >= num_seqs and blocks * 16 >= max_seq_len
    smaller = [b for b in graphs.batch_sizes if b < batch]
    assert not smaller or smaller[-1] < num_seqs
    assert blocks == 1 or blocks // 2 < blocks_needed or blocks == 128


def test_the_batch_ladder_ends_at_the_first_size_that_holds_max_num_seqs():
    assert padded_batch_sizes(256)[-1] == 256 and padded_batch_sizes(100)[-1] == 128
    assert padded_batch_sizes(1) == (1,)
    assert padded_batch_sizes(1000)[-1] == 1000 and BATCH_SIZES[-1] < 1000


def generate(model, decode_graphs: str) -> list[list[int]]:
    """Greedy tokens of six requests through an engine whose runner pads decodes."""
    device = model.device
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=8, max_model_len=256),
        CacheConfig(block_size=BLOCK, num_gpu_blocks_override=200, num_cpu_blocks_override=0),
        execution=ExecutionConfig(enforce_eager=decode_graphs == "off"),
    )
    engine = build_torch_engine(config, VirtualClock(), device=device, model=model)
    if decode_graphs == "eager":  # the CPU's run of the padded path
        runner = engine.executor
        assert isinstance(runner, ModelRunner)
        engine.executor = ModelRunner(
            model, MODEL, BLOCK, 200, 0, device, "eager", max_num_seqs=8, max_model_len=256
        )
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    seqs = [
        engine.add_request(
            EngineRequest(f"r{i}", [(5 * i + j) % 290 + 3 for j in range(7 + 5 * i)], params)
        )
        for i in range(6)
    ]
    while engine.has_unfinished():
        engine.step()
    return [list(seq.output_token_ids) for seq in seqs]


def test_greedy_tokens_are_the_same_with_padded_decodes_as_without(model):
    padded = "capture" if model.device.type == "cuda" else "eager"
    assert generate(model, padded) == generate(model, "off")


def test_graphs_are_captured_on_cuda_unless_enforce_eager_and_never_on_the_cpu():
    from engine.worker.loading import decode_graph_mode

    assert decode_graph_mode(torch.device("cuda"), enforce_eager=False) == "capture"
    assert decode_graph_mode(torch.device("cuda"), enforce_eager=True) == "off"
    assert decode_graph_mode(torch.device("cpu"), enforce_eager=False) == "off"


def test_enforce_eager_is_a_knob_of_every_engine_command():
    from harness.serve.knobs import build_engine_config, knob_flags

    assert build_engine_config({"enforce_eager": True}).execution.enforce_eager
    assert not build_engine_config({}).execution.enforce_eager
    assert "--enforce-eager" in knob_flags({"enforce_eager": True})
