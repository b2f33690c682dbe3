"""The bundled engine's model against transformers' ``LlamaForCausalLM`` on the same
random-weight checkpoints (tests/support/vllm_checkpoint.py): a batch of prompts of
different lengths prefilled together through the paged KV cache (non-contiguous block
tables), then several batched decode steps, each step's logits compared with
transformers' at the same positions. Grouped-query attention (4 query heads, 2 KV
heads) in every checkpoint; plain RoPE, llama3 and linear RoPE scaling.

transformers runs in the vLLM virtualenv (tests/support/hf_logits.py), not in the
project's: vLLM already depends on it there, at the version vLLM is tested with, and
the project's install stays free of transformers and its dependencies (docs/vllm.md).

Error: ``max |ours - transformers| / max |transformers|`` over a step's logits.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.worker.model import AttentionMetadata, allocate_kv_cache
from engine.worker.weights import load_checkpoint
from tests.support.paths import REPO
from tests.support.relative_error import rel_err
from tests.support.vllm_server import vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOL = 2e-5
BLOCK_SIZE = 16
PROMPT_LENS = [5, 23, 40, 17]
DECODE_STEPS = 6


def transformers_logits(python, model_dir, sequences, tmp_path) -> list[torch.Tensor]:
    out = tmp_path / "hf_logits.safetensors"
    subprocess.run(
        [str(python), str(REPO / "tests" / "support" / "hf_logits.py"), str(model_dir), str(out)],
        input=json.dumps(sequences),
        text=True,
        check=True,
        timeout=300,
        env=vllm_env(),
    )
    tensors = load_file(str(out))
    return [tensors[f"seq{i}"] for i in range(len(sequences))]


def block_tables(lens: list[int], rng: np.random.Generator) -> tuple[list[list[int]], int]:
    """Each sequence's blocks, drawn at random from one shared pool (not contiguous)."""
    needed = [-(-n // BLOCK_SIZE) for n in lens]
    pool = rng.permutation(sum(needed)).tolist()
    tables, start = [], 0
    for n in needed:
        tables.append(pool[start : start + n])
        start += n
    return tables, sum(needed)


@pytest.mark.parametrize("variant", ["served", "rope-llama3", "rope-linear"])
def test_paged_prefill_and_decode_match_transformers(
    vllm_python_path, vllm_checkpoints, tmp_path, variant
):
    model_dir = vllm_checkpoints / variant
    model, config = load_checkpoint(model_dir)
    assert config.num_kv_heads < config.num_heads  # GQA
    assert (config.rope_scaling is None) == (variant == "served")
    rng = np.random.default_rng(7)
    sequences = [rng.integers(3, config.vocab_size, n + DECODE_STEPS).tolist() for n in PROMPT_LENS]
    reference = transformers_logits(vllm_python_path, model_dir, sequences, tmp_path)

    total = [n + DECODE_STEPS for n in PROMPT_LENS]
    tables, num_blocks = block_tables(total, rng)
    kv = allocate_kv_cache(config, num_blocks, BLOCK_SIZE)
    errors = []
    # the prefill: every prompt in one step
    meta, positions = AttentionMetadata.build(PROMPT_LENS, PROMPT_LENS, tables, BLOCK_SIZE)
    ids = torch.tensor([t for seq, n in zip(sequences, PROMPT_LENS, strict=True) for t in seq[:n]])
    logits = model(ids, positions, kv, meta)
    expected = torch.stack([ref[n - 1] for ref, n in zip(reference, PROMPT_LENS, strict=True)])
    errors.append(rel_err(logits, expected))
    # decode steps: one token per sequence, every sequence in the batch
    for step in range(DECODE_STEPS):
        lens = [n + step + 1 for n in PROMPT_LENS]
        meta, positions = AttentionMetadata.build([1] * len(lens), lens, tables, BLOCK_SIZE)
        ids = torch.tensor([seq[n - 1] for seq, n in zip(sequences, lens, strict=True)])
        logits = model(ids, positions, kv, meta)
        expected = torch.stack([ref[n - 1] for ref, n in zip(reference, lens, strict=True)])
        errors.append(rel_err(logits, expected))
    assert max(errors) < TOL, errors
    # not a vacuous match: the logits differ between positions
    assert rel_err(reference[0][1], reference[0][0]) > 100 * TOL
