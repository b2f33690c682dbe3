from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.worker.model import AttentionMetadata, allocate_kv_cache, build_model
from engine.worker.model_config import ModelConfig, RopeScaling
from engine.worker.weights import load_checkpoint, load_config, load_weights, save_checkpoint

pytestmark = [pytest.mark.torch_model]

TINY = ModelConfig(
    name="ckpt",
    vocab_size=300,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    seed=7,
)


def step_logits(model, config):
    """Logits of a mixed step (a 9-token prefill and a 1-token sequence)."""
    meta, positions = AttentionMetadata.build([9, 1], [9, 1], [[2, 0, 1], [3]], 4)
    kv = allocate_kv_cache(config, 4, 4)
    return model(torch.arange(5, 15), positions, kv, meta)


def test_save_and_load_round_trip(tmp_path):
    model = build_model(TINY)
    save_checkpoint(model, TINY, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert {
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
    } <= keys
    hf = json.loads((tmp_path / "config.json").read_text())
    assert (hf["model_type"], hf["num_hidden_layers"], hf["num_key_value_heads"]) == ("llama", 2, 2)

    loaded, config = load_checkpoint(tmp_path)
    assert dataclasses.replace(config, name=TINY.name, seed=TINY.seed) == TINY
    for name, param in model.state_dict().items():
        assert torch.equal(param, loaded.state_dict()[name]), name
    assert torch.equal(step_logits(model, TINY), step_logits(loaded, config))


def test_load_into_other_dtype(tmp_path):
    save_checkpoint(build_model(TINY), TINY, tmp_path)
    model, config = load_checkpoint(tmp_path, dtype="bfloat16")
    assert config.dtype == "bfloat16" and model.lm_head.weight.dtype == torch.bfloat16


def test_tied_embeddings(tmp_path):
    tied = dataclasses.replace(TINY, tie_word_embeddings=True)
    model = build_model(tied)
    save_checkpoint(model, tied, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    loaded, config = load_checkpoint(tmp_path)
    assert config.tie_word_embeddings
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, model.model.embed_tokens.weight)
    assert torch.equal(step_logits(model, tied), step_logits(loaded, config))


def test_tied_checkpoint_that_also_stores_lm_head(tmp_path):
    tied = dataclasses.replace(TINY, tie_word_embeddings=True)
    model = build_model(tied)
    save_checkpoint(model, tied, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # old HF exports
    save_file(tensors, tmp_path / "model.safetensors")
    loaded, _ = load_checkpoint(tmp_path)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


def test_sharded_checkpoint(tmp_path):
    model = build_model(TINY)
    save_checkpoint(model, TINY, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[:10]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({k: tensors[k] for k in names[10:]}, tmp_path / "model-00002-of-00002.safetensors")
    loaded, config = load_checkpoint(tmp_path)
    assert torch.equal(step_logits(model, TINY), step_logits(loaded, config))


def test_missing_key_is_named(tmp_path):
    save_checkpoint(build_model(TINY), TINY, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="missing key\\(s\\) 'model.layers.1.mlp.up_proj.weight'"):
        load_checkpoint(tmp_path)


def test_untied_checkpoint_without_lm_head_is_an_error(tmp_path):
    save_checkpoint(build_model(TINY), TINY, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="'lm_head.weight'"):
        load_checkpoint(tmp_path)


def test_shape_mismatch_is_named(tmp_path):
    save_checkpoint(build_model(TINY), TINY, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError,
        match="'model.layers.0.self_attn.k_proj.weight' has shape "
        "\\(64, 64\\), the config implies \\(32, 64\\)",
    ):
        load_checkpoint(tmp_path)


def test_unexpected_key_is_named(tmp_path):
    save_checkpoint(build_model(TINY), TINY, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.2.mlp.up_proj.weight"] = torch.zeros(96, 64)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="unexpected key 'model.layers.2.mlp.up_proj.weight'"):
        load_weights(build_model(TINY), tmp_path)


def test_missing_files_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf_config()))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_checkpoint(tmp_path)


def test_from_hf_llama_config():
    hf = {  # the shape of a Llama 3.2 1B config.json
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "attention_bias": False,
        "mlp_bias": False,
    }
    config = ModelConfig.from_hf_config(hf)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        16,
        32,
        8,
        64,
    )
    assert (config.dtype, config.eos_token_id, config.tie_word_embeddings) == (
        "bfloat16",
        128001,
        True,
    )
    assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert ModelConfig.from_hf_config(config.to_hf_config()) == config
    with pytest.raises(ValueError, match="only Llama checkpoints"):
        ModelConfig.from_hf_config({**hf, "model_type": "mistral"})
    with pytest.raises(ValueError, match="attention_bias=true are not supported"):
        ModelConfig.from_hf_config({**hf, "attention_bias": True})
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
        ModelConfig.from_hf_config({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


def test_transformers_5_rope_parameters_are_read_as_rope_theta_and_scaling():
    """transformers 5 writes `rope_parameters` (rope_theta inside) and neither
    `rope_theta` nor `rope_scaling`: the scaling was silently dropped before."""
    base = {k: v for k, v in TINY.to_hf_config().items() if k not in ("rope_theta", "rope_scaling")}
    scaled = {
        **base,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
    }
    config = ModelConfig.from_hf_config(scaled)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    plain = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}}
    config = ModelConfig.from_hf_config(plain)
    assert (config.rope_theta, config.rope_scaling) == (20000.0, None)
    theta_only = {**base, "rope_parameters": {"rope_theta": 30000.0}}
    config = ModelConfig.from_hf_config(theta_only)
    assert (config.rope_theta, config.rope_scaling) == (30000.0, None)
    linear = {**base, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}}
    assert ModelConfig.from_hf_config(linear).rope_scaling == RopeScaling("linear", 4.0)


def test_from_json_accepts_hf_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY.to_hf_config()))
    assert dataclasses.replace(ModelConfig.from_json(path), seed=TINY.seed) == TINY
