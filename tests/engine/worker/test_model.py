"""The paged-attention model against an independent dense reference, on the CPU.

Error metric for logits: `max |paged - reference| / max |reference|` over every compared
logit of a step (relative to the largest logit magnitude, not per element). The
reference is a separate functional Llama written here, computed in float64 from the
same float32 weights (complex-number RoPE, repeated KV heads, SDPA with is_causal).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.core import prefill_groups
from engine.worker import attention_metadata
from engine.worker.dense_reference import (
    DenseKVCache,
    dense_decode_forward,
    dense_reference_forward,
)
from engine.worker.model import (
    AttentionMetadata,
    allocate_kv_cache,
    apply_rope,
    build_model,
    rope_inv_freq,
)
from engine.worker.model_config import PRESETS, ModelConfig, RopeScaling
from tests.support.relative_error import rel_err

pytestmark = [pytest.mark.torch_model]

TOL = 1e-5

GQA = ModelConfig(
    name="t-gqa",
    vocab_size=512,
    hidden_size=64,
    num_layers=2,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=160,
    seed=3,
)
MHA = dataclasses.replace(GQA, name="t-mha", num_heads=4, num_kv_heads=4)
MQA = dataclasses.replace(GQA, name="t-mqa", num_heads=4, num_kv_heads=1)


def reference_logits(model, token_ids: torch.Tensor) -> torch.Tensor:
    """float64 logits `[L, vocab]` of every position, from the state dict alone."""
    cfg = model.config
    sd = {k: v.detach().cpu().double() for k, v in model.state_dict().items()}
    num_tokens, hd = token_ids.shape[0], cfg.head_dim
    group = cfg.num_heads // cfg.num_kv_heads
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.arange(num_tokens, dtype=torch.float64)[:, None] * inv_freq[None, :]
    rotation = torch.polar(torch.ones_like(angles), angles)[:, None, :]  # [L, 1, hd/2]

    def rope(t: torch.Tensor) -> torch.Tensor:  # rotate_half: dim i pairs with i + hd/2
        z = torch.complex(t[..., : hd // 2], t[..., hd // 2 :]) * rotation
        return torch.cat([z.real, z.imag], dim=-1)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    x = sd["model.embed_tokens.weight"][token_ids]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = rope((h @ sd[p + "self_attn.q_proj.weight"].T).view(num_tokens, cfg.num_heads, hd))
        k = rope((h @ sd[p + "self_attn.k_proj.weight"].T).view(num_tokens, cfg.num_kv_heads, hd))
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(num_tokens, cfg.num_kv_heads, hd)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        att = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )
        x = x + att.transpose(0, 1).reshape(num_tokens, -1) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate, up = h @ sd[p + "mlp.gate_proj.weight"].T, h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def sharpened(config: ModelConfig) -> torch.nn.Module:
    """A model whose attention is peaked (q, k weights x10, scores x100).

    With the default init (std 0.02) attention is nearly uniform, which would hide
    position and masking errors from a logit comparison.
    """
    model = build_model(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
    return model


def shuffled_block_tables(rng, total_lens: list[int], block_size: int, spare: int = 7):
    """Non-contiguous, shuffled block ids covering each sequence's final length."""
    needed = [math.ceil(n / block_size) for n in total_lens]
    ids = rng.permutation(sum(needed) + spare).tolist()
    tables, start = [], 0
    for n in needed:
        tables.append(ids[start : start + n])
        start += n
    return tables, sum(needed) + spare


def run_schedule(model, block_size: int, seed: int, device: str = "cpu"):
    """Chunked prefills and decodes of several sequences, mixed in shared steps, with
    the model, its cache and the step's tensors on ``device``.

    Every step returns the logits of all its tokens; each is checked against the
    reference (float64, on the CPU) at that position. Returns the step kinds seen.
    """
    rng = np.random.default_rng(seed)
    cfg = model.config
    # (prompt chunk sizes, decode steps, first step)
    plans = [
        ([16, 13, 8], 4, 0),
        ([5], 6, 0),
        ([1], 5, 1),
        ([30, 40], 2, 1),
        ([9, 2], 3, 3),
        ([3], 8, 2),
    ]
    total_lens = [sum(chunks) + decodes for chunks, decodes, _ in plans]
    tables, num_blocks = shuffled_block_tables(rng, total_lens, block_size)
    kv = allocate_kv_cache(cfg, num_blocks, block_size, device)
    tokens = [torch.from_numpy(rng.integers(3, cfg.vocab_size, n)) for n in total_lens]
    refs = [reference_logits(model, t) for t in tokens]
    queues = [[*chunks, *[1] * decodes] for chunks, decodes, _ in plans]
    done = [0] * len(plans)
    kinds, worst, step = set(), 0.0, 0
    while any(queues):
        seqs = [s for s, (_, _, first) in enumerate(plans) if first <= step and queues[s]]
        seqs = [seqs[i] for i in rng.permutation(len(seqs))]  # order must not matter
        step += 1
        if not seqs:
            continue
        q_lens = [queues[s].pop(0) for s in seqs]
        seq_lens = [done[s] + q for s, q in zip(seqs, q_lens, strict=True)]
        meta, positions = AttentionMetadata.build(
            q_lens, seq_lens, [tables[s] for s in seqs], block_size, device
        )
        meta.logits_indices = torch.arange(meta.num_tokens, device=device)
        input_ids = torch.cat([tokens[s][done[s] : n] for s, n in zip(seqs, seq_lens, strict=True)])
        logits = model(input_ids.to(device), positions, kv, meta).cpu()
        positions = positions.cpu()
        assert logits.dtype == torch.float32 and logits.shape == (meta.num_tokens, cfg.vocab_size)
        expected_positions = torch.cat(
            [torch.arange(done[s], n) for s, n in zip(seqs, seq_lens, strict=True)]
        )
        assert torch.equal(positions, expected_positions)
        expected = torch.cat([refs[s][done[s] : n] for s, n in zip(seqs, seq_lens, strict=True)])
        worst = max(worst, rel_err(logits, expected))
        kinds.add("decode-only" if max(q_lens) == 1 else "mixed" if min(q_lens) == 1 else "prefill")
        if len(meta.prefill) > 1:
            kinds.add("prefill-groups")
        for s, n in zip(seqs, seq_lens, strict=True):
            done[s] = n
    return kinds, worst


@pytest.mark.parametrize("config", [GQA, MHA, MQA], ids=lambda c: c.name)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("grouped", [False, True], ids=["few-groups", "length-groups"])
@pytest.mark.parametrize("impl", ["gather", "sdpa"])
def test_paged_attention_matches_dense_reference(config, block_size, grouped, impl, monkeypatch):
    if grouped:  # split decodes into length groups whenever lengths differ by a bucket,
        # and prefill chunks into groups whenever padding them together costs anything
        monkeypatch.setattr(attention_metadata, "DECODE_GROUP_OVERHEAD_SLOTS", 0)
        monkeypatch.setattr(prefill_groups, "PREFILL_GROUP_OVERHEAD_WORK", 0)
    else:  # every prefill chunk of a step in one padded group
        monkeypatch.setattr(prefill_groups, "PREFILL_GROUP_OVERHEAD_WORK", 10**12)
    model = sharpened(config)
    model.attention_impl = impl
    kinds, worst = run_schedule(model, block_size, seed=block_size)
    assert kinds == {"decode-only", "mixed", "prefill"} | ({"prefill-groups"} if grouped else set())
    assert worst < TOL, f"max relative logit error {worst:.2e}"


def test_decode_groups_by_length(monkeypatch):
    lens = [3, 60, 5, 61, 200, 4]
    meta, _ = AttentionMetadata.build([1] * 6, lens, [list(range(50))] * 6, block_size=4)
    assert len(meta.decode) == 1 and meta.decode[0].token_indices is None
    monkeypatch.setattr(attention_metadata, "DECODE_GROUP_OVERHEAD_SLOTS", 0)
    meta, _ = AttentionMetadata.build([1] * 6, lens, [list(range(50))] * 6, block_size=4)
    groups = [g.token_indices.tolist() for g in meta.decode]
    assert groups == [[0, 5], [2], [1, 3], [4]]  # 1, 2, 15-16 and 50 blocks
    assert [g.context_slots.shape[1] for g in meta.decode] == [4, 8, 64, 200]
    meta, _ = AttentionMetadata.build([1] * 3, [64, 61, 63], [list(range(16))] * 3, block_size=4)
    assert len(meta.decode) == 1  # same bucket


def test_model_dense_reference_matches_functional_reference():
    model = sharpened(GQA)
    tokens = torch.randint(3, GQA.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    assert rel_err(dense_reference_forward(model, tokens), reference_logits(model, tokens)) < TOL


def test_comparison_detects_wrong_positions_and_wrong_blocks():
    """The comparison has teeth: a chunk's RoPE off by one, or a wrong block, fail it."""
    model = sharpened(GQA)
    tokens = torch.randint(3, GQA.vocab_size, (20,), generator=torch.Generator().manual_seed(0))
    expected = reference_logits(model, tokens)
    table = [5, 1, 7, 0, 3]
    kv = allocate_kv_cache(GQA, 8, 4)
    meta, positions = AttentionMetadata.build([12], [12], [table], 4)
    model(tokens[:12], positions, kv, meta)
    meta, positions = AttentionMetadata.build([7], [19], [table], 4)
    meta.logits_indices = torch.arange(7)
    # (positions are relative in RoPE: only a shift against the cached chunk shows)
    for shift in (1, 0):  # the correct run last: it rewrites the cached K
        error = rel_err(model(tokens[12:19], positions + shift, kv, meta), expected[12:19])
        assert error < TOL if shift == 0 else error > 100 * TOL
    # (attention is order-free over keys, so a wrong block must hold other data to show)
    for decode_table, ok in ((table, True), ([5, 1, 2, 0, 3], False)):
        meta, positions = AttentionMetadata.build([1], [20], [decode_table], 4)
        error = rel_err(model(tokens[19:], positions, kv, meta), expected[19:])
        assert error < TOL if ok else error > 100 * TOL


def test_greedy_decoding_through_paged_cache_matches_full_recompute():
    config = dataclasses.replace(PRESETS["tiny"], seed=11)
    model = build_model(config)
    block_size = 16
    rng = np.random.default_rng(5)
    prompt = rng.integers(3, config.vocab_size, 21).tolist()
    num_new = 24
    tables, num_blocks = shuffled_block_tables(rng, [len(prompt) + num_new], block_size)
    kv = allocate_kv_cache(config, num_blocks, block_size)

    meta, positions = AttentionMetadata.build([len(prompt)], [len(prompt)], tables, block_size)
    generated = [int(model(torch.tensor(prompt), positions, kv, meta).argmax(-1))]
    while len(generated) < num_new:
        seq_len = len(prompt) + len(generated)
        meta, positions = AttentionMetadata.build([1], [seq_len], tables, block_size)
        logits = model(torch.tensor(generated[-1:]), positions, kv, meta)
        generated.append(int(logits.argmax(-1)))

    recomputed = []
    with torch.inference_mode():
        for _ in range(num_new):
            ids = torch.tensor(prompt + recomputed)
            recomputed.append(int(dense_reference_forward(model, ids)[-1].argmax()))
    assert generated == recomputed
    assert len(set(generated)) > 1  # not a degenerate constant output


def test_batched_decode_matches_dense_kv_cache_baseline():
    """The benchmark baseline (contiguous cache) computes the same step as the paged path."""
    model = sharpened(GQA)
    rng = np.random.default_rng(1)
    lens = [9, 17, 4, 12]
    block_size = 4
    tables, num_blocks = shuffled_block_tables(rng, lens, block_size)
    kv = allocate_kv_cache(GQA, num_blocks, block_size)
    dense = DenseKVCache(GQA, len(lens), max(lens))
    tokens = [torch.from_numpy(rng.integers(3, GQA.vocab_size, n)) for n in lens]
    for t in range(max(lens)):  # one token per step; shorter sequences keep re-writing a pad
        seq_lens = [min(t + 1, n) for n in lens]
        ids = torch.stack([tokens[s][n - 1] for s, n in enumerate(seq_lens)])
        meta, positions = AttentionMetadata.build([1] * len(lens), seq_lens, tables, block_size)
        paged = model(ids, positions, kv, meta)
        with torch.inference_mode():
            baseline = dense_decode_forward(model, ids, positions, dense)
        torch.testing.assert_close(paged, baseline, rtol=1e-5, atol=1e-6)


def test_logits_indices_select_last_token_of_requested_sequences():
    model = build_model(GQA)
    tables = [[0, 1, 2], [3, 4]]
    meta, positions = AttentionMetadata.build([5, 1], [9, 6], tables, 4, logits_for=[False, True])
    assert meta.logits_indices.tolist() == [5]
    kv = allocate_kv_cache(GQA, 5, 4)
    assert model(torch.arange(3, 9), positions, kv, meta).shape == (1, GQA.vocab_size)


def test_build_computes_positions_and_slots():
    meta, positions = AttentionMetadata.build(
        query_lens=[3, 1], seq_lens=[5, 9], block_tables=[[7, 2], [3, 0, 5, 6]], block_size=4
    )
    assert positions.tolist() == [2, 3, 4, 8]
    # seq 0: positions 2, 3 in block 7, position 4 in block 2; seq 1: position 8 in block 5
    assert meta.slot_mapping.tolist() == [30, 31, 8, 20]
    assert meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.seq_lens.tolist() == [5, 9]
    assert meta.block_tables.tolist() == [[7, 2, 0], [3, 0, 5]]  # trimmed to need, padded
    assert meta.logits_indices.tolist() == [2, 3]
    assert (meta.max_query_len, meta.max_seq_len, meta.is_decode_only) == (3, 9, False)
    assert len(meta.decode) == 1 and meta.decode[0].token_indices.tolist() == [3]
    assert len(meta.prefill) == 1 and meta.prefill[0].token_indices.tolist() == [0, 1, 2]


def test_build_rejects_short_block_table():
    with pytest.raises(ValueError, match="sequence 1: block table has 1 blocks, 2 needed"):
        AttentionMetadata.build([1, 1], [3, 5], [[0], [1]], block_size=4)
    with pytest.raises(ValueError, match="query_len <= seq_len"):
        AttentionMetadata.build([4], [3], [[0]], block_size=4)


def test_kv_cache_layout_and_size():
    config = PRESETS["tiny"]
    kv = allocate_kv_cache(config, num_blocks=10, block_size=16)
    assert len(kv) == config.num_layers
    k, v = kv[0]
    assert k.shape == v.shape == (10, 16, config.num_kv_heads, config.head_dim)
    assert k.dtype == torch.float32 and not k.any()
    total = sum(t.numel() * t.element_size() for layer in kv for t in layer)
    assert total == 10 * config.kv_bytes_per_block(16)


def test_same_seed_same_weights_different_seed_different():
    a, b = build_model(GQA), build_model(GQA)
    c = build_model(dataclasses.replace(GQA, seed=GQA.seed + 1))
    for (name, pa), pb, pc in zip(
        a.state_dict().items(), b.state_dict().values(), c.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name
    w = a.model.layers[0].mlp.up_proj.weight
    assert abs(w.std().item() - 0.02) < 0.002  # logits not degenerate, not huge
    tokens = torch.arange(3, 20)
    assert torch.equal(dense_reference_forward(a, tokens), dense_reference_forward(b, tokens))
    assert not torch.equal(dense_reference_forward(a, tokens), dense_reference_forward(c, tokens))


def test_reduced_precision_model_runs():
    for dtype in ("bfloat16", "float16"):
        config = dataclasses.replace(GQA, dtype=dtype)
        model = build_model(config)
        assert model.lm_head.weight.dtype == getattr(torch, dtype)
        assert model.inv_freq.dtype == torch.float32
        kv = allocate_kv_cache(config, 4, 4)
        assert kv[0][0].dtype == getattr(torch, dtype)
        meta, positions = AttentionMetadata.build([6, 1], [6, 1], [[0, 1], [2]], 4)
        logits = model(torch.arange(3, 10), positions, kv, meta)
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
        fp32 = build_model(GQA)(torch.arange(3, 10), positions, allocate_kv_cache(GQA, 4, 4), meta)
        assert rel_err(logits, fp32.double()) < 0.05


def test_tied_embeddings_share_one_tensor():
    model = build_model(dataclasses.replace(GQA, tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_apply_rope_is_rotate_half_rotation():
    hd = 8
    x = torch.randn(3, 2, hd, dtype=torch.float64)
    pos = torch.tensor([0.0, 1.0, 5.0], dtype=torch.float64)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = pos[:, None] * inv_freq
    out = apply_rope(x, angles.cos()[:, None, :], angles.sin()[:, None, :])
    i, j = 1, 1 + hd // 2  # dims i and i + hd/2 form one rotating pair
    theta = angles[2, 1]
    expected_i = x[2, 0, i] * theta.cos() - x[2, 0, j] * theta.sin()
    expected_j = x[2, 0, j] * theta.cos() + x[2, 0, i] * theta.sin()
    assert torch.allclose(out[2, 0, [i, j]], torch.stack([expected_i, expected_j]))
    assert torch.equal(out[0], x[0])  # position 0 is not rotated


def test_llama3_rope_scaling():
    config = ModelConfig(
        hidden_size=256,
        num_heads=2,
        rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
    )
    plain = rope_inv_freq(dataclasses.replace(config, rope_scaling=None))
    scaled = rope_inv_freq(config)
    wavelen = 2 * math.pi / plain
    assert torch.equal(scaled[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])  # high freqs kept
    assert torch.allclose(scaled[wavelen > 8192], plain[wavelen > 8192] / 8)  # low freqs / 8
    medium = (wavelen >= 2048) & (wavelen <= 8192)
    assert medium.any()
    assert ((scaled[medium] < plain[medium]) & (scaled[medium] > plain[medium] / 8)).all()
    linear = dataclasses.replace(config, rope_scaling=RopeScaling("linear", 4.0))
    assert torch.allclose(rope_inv_freq(linear), plain / 4)


# ---- ModelConfig ------------------------------------------------------------------------------


def test_presets():
    tiny = ModelConfig.preset("tiny")
    assert tiny == ModelConfig() and tiny.head_dim == 32 and tiny.num_queries_per_kv == 4
    small = ModelConfig.preset("small", dtype="bfloat16")
    assert (small.hidden_size, small.num_layers, small.dtype) == (1024, 12, "bfloat16")
    assert small.kv_bytes_per_block(16) == 2 * 12 * 16 * 4 * 64 * 2
    assert tiny.kv_bytes_per_block(16) == 2 * 4 * 16 * 2 * 32 * 4
    assert tiny.kv_bytes_per_token() == tiny.num_layers * tiny.kv_bytes_per_token_per_layer()
    model = build_model(tiny)
    assert tiny.num_parameters == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        ModelConfig.preset("huge")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"hidden_size": 100, "num_heads": 8},
            "hidden_size \\(100\\) must be divisible by num_heads",
        ),
        (
            {"num_heads": 8, "num_kv_heads": 3},
            "num_heads \\(8\\) must be divisible by num_kv_heads",
        ),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"vocab_size": -5}, "vocab_size must be a positive integer"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"eos_token_id": 5000}, "eos_token_id \\(5000\\) must be in"),
        ({"hidden_size": 24, "num_heads": 8}, "head_dim \\(3\\) must be even"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps must be > 0"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**overrides)


def test_config_from_json(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {
                "name": "custom",
                "hidden_size": 128,
                "num_heads": 4,
                "num_kv_heads": 1,
                "num_layers": 2,
            }
        )
    )
    config = ModelConfig.from_json(path)
    assert (config.name, config.hidden_size, config.head_dim, config.vocab_size) == (
        "custom",
        128,
        32,
        ModelConfig().vocab_size,
    )
    path.write_text(json.dumps({"hidden_size": 128, "num_hiden_layers": 2}))
    with pytest.raises(ValueError, match="unknown ModelConfig keys \\['num_hiden_layers'\\]"):
        ModelConfig.from_json(path)
    path.write_text(json.dumps({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    assert ModelConfig.from_json(path).rope_scaling == RopeScaling("linear", 2.0)
    path.write_text(json.dumps({"rope_scaling": {"rope_type": "linear", "fator": 2.0}}))
    with pytest.raises(ValueError, match="unknown rope_scaling keys \\['fator'\\]"):
        ModelConfig.from_json(path)
