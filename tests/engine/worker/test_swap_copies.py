"""Block copies between the device and host pools (engine/worker/swap_copies.py) on the
device under test (``SCHEDSCOPE_TEST_DEVICE``: the CPU here, CUDA under gpu.sh, where
the staging is pinned and the copy to the host runs on a stream of its own)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.worker.attention_metadata import allocate_kv_cache
from engine.worker.model_config import ModelConfig
from engine.worker.swap_copies import SwapCopier
from tests.support.device import device_under_test

pytestmark = [pytest.mark.torch_model]

CONFIG = ModelConfig(
    name="swap", vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2
)
BLOCK = 4


def pools(device: str, num_device: int = 12, num_host: int = 10):
    generator = torch.Generator().manual_seed(0)
    device_cache = allocate_kv_cache(CONFIG, num_device, BLOCK, device)
    for k, v in device_cache:
        k.copy_(torch.randn(k.shape, generator=generator))
        v.copy_(torch.randn(v.shape, generator=generator))
    host_cache = allocate_kv_cache(CONFIG, num_host, BLOCK, "cpu", pin_memory=device == "cuda")
    return device_cache, host_cache, SwapCopier(device_cache, host_cache, torch.device(device))


def test_a_swap_out_copies_the_blocks_as_they_were_before_the_forward_refilled_them():
    device = device_under_test()
    device_cache, host_cache, swaps = pools(device)
    before = [(k[[2, 7]].cpu(), v[[2, 7]].cpu()) for k, v in device_cache]
    swaps.swap_out([(2, 0), (7, 9)])
    for k, v in device_cache:  # the step's forward writes new K/V into the freed blocks
        k[[2, 7]] = 0.0
        v[[2, 7]] = 0.0
    swaps.finish()
    for (hk, hv), (k, v) in zip(host_cache, before, strict=True):
        assert torch.equal(hk[[0, 9]], k) and torch.equal(hv[[0, 9]], v)
    assert swaps.swap_out_s > 0


def test_a_swap_in_after_a_swap_out_reads_the_finished_host_blocks():
    device = device_under_test()
    device_cache, host_cache, swaps = pools(device)
    expected = [(k[5].clone(), v[5].clone()) for k, v in device_cache]
    swaps.swap_out([(5, 3)])
    swaps.swap_in([(3, 11)])  # the same host block, before finish(): it finishes first
    for (k, v), (ek, ev) in zip(device_cache, expected, strict=True):
        assert torch.equal(k[11], ek) and torch.equal(v[11], ev)


@settings(max_examples=25, deadline=None)
@given(
    moves=st.lists(
        st.tuples(st.integers(0, 11), st.integers(0, 9)),
        min_size=1,
        max_size=8,
        unique_by=(
            lambda m: m[0],
            lambda m: m[1],
        ),
    )
)
def test_out_and_back_in_restores_every_layer_exactly(moves):
    device = device_under_test()
    device_cache, _, swaps = pools(device)
    original = [(k.clone(), v.clone()) for k, v in device_cache]
    swaps.swap_out(moves)
    swaps.finish()
    for k, v in device_cache:
        k.zero_()
        v.zero_()
    swaps.swap_in([(host, dev) for dev, host in moves])
    for (k, v), (ok, ov) in zip(device_cache, original, strict=True):
        for dev, _ in moves:
            assert torch.equal(k[dev], ok[dev]) and torch.equal(v[dev], ov[dev])


def test_no_mapping_copies_nothing_and_takes_no_time():
    device_cache, host_cache, swaps = pools(device_under_test())
    swaps.swap_out([])
    swaps.swap_in([])
    swaps.finish()
    assert swaps.swap_out_s == 0 and swaps.swap_in_s == 0
    assert all(not k.any() for k, _ in host_cache)


def test_a_swap_out_left_pending_by_a_failed_step_lands_before_the_next_one():
    device = device_under_test()
    device_cache, host_cache, swaps = pools(device)
    first = [(k[1].cpu(), v[1].cpu()) for k, v in device_cache]
    swaps.swap_out([(1, 4)])  # the step's forward then raised: no finish()
    second = [(k[6].cpu(), v[6].cpu()) for k, v in device_cache]
    swaps.swap_out([(6, 8)])  # the next step reuses the staging buffer
    swaps.finish()
    for (hk, hv), (k1, v1), (k6, v6) in zip(host_cache, first, second, strict=True):
        assert torch.equal(hk[4], k1) and torch.equal(hv[4], v1)
        assert torch.equal(hk[8], k6) and torch.equal(hv[8], v6)
