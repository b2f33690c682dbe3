"""The torch executor with prefix caching, for real: a hit skips the computation of the
cached tokens (the prefill runs only the uncached suffix, attending over the cached
blocks), and greedy outputs are the same tokens as without caching — for prompts
sharing prefixes of several lengths (none, less than a block, one block, two and a
half, a whole duplicate prompt), with chunked prefill, with recompute preemptions in
between, and with evictions forced by a small pool."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.clock import VirtualClock
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.factory import build_torch_engine
from engine.worker.model import build_model
from tests.engine.worker.test_model_runner import MODEL as RUNNER_MODEL
from tests.support.device import device_under_test

pytestmark = [pytest.mark.torch_model]

MODEL = dataclasses.replace(RUNNER_MODEL, seed=5)  # the runner tests' model, its own seed
BLOCK = 16
SHARED = [(11 * j) % 500 + 3 for j in range(48)]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def prompts() -> list[list[int]]:
    """Prompts sharing the first 0, 8, 16, 40 and 48 tokens of SHARED (each with its own
    suffix), two exact duplicates of one of them, and one whose second block repeats
    its first (a hit must match the whole prefix, not the block's tokens alone)."""
    out = []
    for i, shared in enumerate((0, 8, 16, 40, 48, 40, 16)):
        suffix = [(29 * i + 7 * j) % 500 + 3 for j in range(5 + 3 * i)]
        out.append(SHARED[:shared] + suffix)
    out.append(list(out[3]))
    out.append(list(out[3]))
    out.append(SHARED[:16] * 2 + [9, 8, 7])  # its second block's tokens are the first's
    return out


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(MODEL, device_under_test())


def run(model, scheduler: SchedulerConfig, cache: CacheConfig, stagger: bool = True):
    """Every prompt through one engine (arriving a step apart with ``stagger``, so later
    ones find earlier ones' blocks); the engine and the sequences, in prompt order."""
    config = EngineConfig(scheduler, cache, model="tiny")
    engine = build_torch_engine(config, VirtualClock(), device=model.device, model=model)
    pending = [EngineRequest(f"r{i}", p, GREEDY) for i, p in enumerate(prompts())]
    seqs = []
    steps = 0
    while pending or engine.has_unfinished():
        if pending and (stagger or not seqs):
            batch = [pending.pop(0)] if stagger else pending[:]
            if not stagger:
                pending.clear()
            seqs += [engine.add_request(request) for request in batch]
        engine.step()
        engine.scheduler.check_invariants()
        steps += 1
        assert steps < 5000
    return engine, seqs


@pytest.fixture(scope="module")
def reference(model):
    """Each prompt alone, no cache: the tokens it must always produce."""
    _, seqs = run(
        model,
        SchedulerConfig(max_num_seqs=1),
        CacheConfig(
            block_size=BLOCK,
            num_gpu_blocks_override=64,
            num_cpu_blocks_override=0,
            enable_prefix_caching=False,
        ),
    )
    assert all(s.num_cached_tokens == 0 for s in seqs)
    return [s.output_token_ids for s in seqs]


def test_hits_skip_their_tokens_and_change_no_output(model, reference):
    _, seqs = run(
        model,
        SchedulerConfig(max_num_seqs=8),
        CacheConfig(block_size=BLOCK, num_gpu_blocks_override=64, num_cpu_blocks_override=0),
    )
    cached = [s.num_cached_tokens for s in seqs]
    assert cached[:3] == [0, 0, 0]  # nothing shared, or less than a block (8 tokens)
    assert cached[7] == cached[8] == len(prompts()[3]) // BLOCK * BLOCK  # duplicates
    assert sum(cached) > 0
    assert [s.output_token_ids for s in seqs] == reference


def test_together_in_one_step_with_chunked_prefill(model, reference):
    """All arrive at once: later admissions of the same step hit blocks whose KV that
    very step writes; a budget of 32 tokens chunks the longer prefills."""
    _, seqs = run(
        model,
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32),
        CacheConfig(block_size=BLOCK, num_gpu_blocks_override=64, num_cpu_blocks_override=0),
        stagger=False,
    )
    assert sum(s.num_cached_tokens for s in seqs) > 0
    assert [s.output_token_ids for s in seqs] == reference


def test_recompute_preemptions_and_evictions_change_no_output(model, reference):
    """A pool of 12 blocks for 9 requests of up to 6 blocks each: recompute preemptions
    re-hit what was not evicted, and evictions happen."""
    engine, seqs = run(
        model,
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, preemption_mode="recompute"),
        CacheConfig(block_size=BLOCK, num_gpu_blocks_override=12, num_cpu_blocks_override=0),
    )
    assert engine.block_manager.num_evicted_blocks > 0
    assert sum(s.num_preemptions_recompute for s in seqs) > 0
    assert [s.output_token_ids for s in seqs] == reference
