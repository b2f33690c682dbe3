"""The model's paths on the device under test (``SCHEDSCOPE_TEST_DEVICE``: the CPU here,
CUDA under benchmarks/gpu.sh): paged attention, in both implementations, against the
dense float64 reference; and the GPU-sized preset's shape and its refusal off CUDA."""

from __future__ import annotations

import pytest
import torch

from engine.worker.model import build_model
from engine.worker.model_config import CUDA_ONLY_PRESETS, ModelConfig, ModelDoesNotFitError
from engine.worker.paged_attention import default_attention_impl
from tests.engine.worker.test_model import GQA, run_schedule, sharpened
from tests.support.device import device_under_test

pytestmark = [pytest.mark.torch_model]

# float32 throughout; CUDA's kernels sum in another order than the CPU's.
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-4}


@pytest.mark.parametrize("impl", ["gather", "sdpa"])
def test_paged_attention_on_the_device_matches_the_dense_reference(impl):
    device = device_under_test()
    model = sharpened(GQA).to(device)
    model.attention_impl = impl
    kinds, worst = run_schedule(model, block_size=16, seed=5, device=device)
    assert {"decode-only", "mixed", "prefill"} <= kinds
    assert worst < TOLERANCE[device], f"{impl} on {device}: max relative error {worst:.2e}"


def test_each_device_has_its_attention_default():
    assert default_attention_impl(torch.device("cpu")) == "gather"
    assert default_attention_impl(torch.device("cuda")) == "sdpa"


def test_the_8b_preset_has_llama_3_8b_geometry():
    config = ModelConfig.preset("llama3-8b")
    shape = (
        config.vocab_size,
        config.hidden_size,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.intermediate_size,
        config.dtype,
    )
    assert shape == (128256, 4096, 32, 32, 8, 14336, "bfloat16")
    assert config.num_parameters == 8_030_261_248  # Llama-3-8B's count
    assert config.kv_bytes_per_token() == 128 * 1024  # 32 layers x 2 x 8 heads x 128 x 2 B
    assert "llama3-8b" in CUDA_ONLY_PRESETS


def test_the_8b_preset_refuses_the_cpu_naming_the_memory_it_needs():
    with pytest.raises(ModelDoesNotFitError) as refused:
        build_model(ModelConfig.preset("llama3-8b"), "cpu")
    message = str(refused.value)
    assert "runs on CUDA only" in message and "16.1 GB" in message
    assert "128 KiB per token" in message and "'tiny' or 'small'" in message
