"""Local checkpoints in the Hugging Face Llama layout: `config.json` + `*.safetensors`.

Parameter names are Hugging Face's (`model.layers.{i}.self_attn.q_proj.weight`, ...), as
are the model's own, and q/k projections are stored for the "rotate_half" RoPE
convention that `engine.worker.model.apply_rope` uses, so real Llama checkpoints load as is.
Nothing is downloaded: `model_dir` is a local directory.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.worker.model import LlamaForCausalLM, empty_model
from engine.worker.model_config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Keys some checkpoints carry that the model computes itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir}: no {CONFIG_FILE} (expected a Hugging Face Llama checkpoint)"
        )
    return ModelConfig.from_hf_config(json.loads(path.read_text()), name=Path(model_dir).name)


def load_checkpoint(
    model_dir: str | Path, device: torch.device | str = "cpu", dtype: str | None = None
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The model and its config from `model_dir`; `dtype` overrides the checkpoint's."""
    config = load_config(model_dir)
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype)
    model = empty_model(config, device)
    load_weights(model, model_dir)
    return model, config


def load_weights(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    """Copy every parameter of `model` from the `*.safetensors` files in `model_dir`.

    Raises `KeyError` naming a missing or unexpected key, `ValueError` naming a key whose
    shape differs. A tied `lm_head.weight` may be absent (it is the embedding).
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    params = dict(model.named_parameters())  # a tied lm_head is listed once, as embed_tokens
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for key in f.keys():
                if key.endswith(_IGNORED_SUFFIXES) or (tied and key == "lm_head.weight"):
                    continue
                if key not in params:
                    raise KeyError(f"{file.name}: unexpected key {key!r} (not a Llama parameter)")
                tensor = f.get_tensor(key)
                param = params[key]
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(
                        f"{file.name}: {key!r} has shape {tuple(tensor.shape)}, "
                        f"the config implies {tuple(param.shape)}"
                    )
                with torch.no_grad():
                    param.copy_(tensor)
                loaded.add(key)
    missing = sorted(set(params) - loaded)
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise KeyError(f"{model_dir}: missing key(s) {shown}{more}")


def save_checkpoint(model: LlamaForCausalLM, config: ModelConfig, model_dir: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` in the Hugging Face Llama layout.

    With tied embeddings `lm_head.weight` is omitted, as Hugging Face does.
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / CONFIG_FILE).write_text(json.dumps(config.to_hf_config(), indent=2) + "\n")
    state = {
        name: param.detach().to("cpu").contiguous()
        for name, param in model.named_parameters()  # tied lm_head listed once
    }
    save_file(state, str(model_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    return model_dir
