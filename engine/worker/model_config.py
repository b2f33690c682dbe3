"""Shapes of the bundled Llama-architecture model, and the KV-cache sizes derived from them.

Kept free of torch imports: the simulator and the CLI read model shapes and KV sizes
without loading torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Hugging Face spells dtypes several ways in config.json ("torch_dtype" or "dtype").
_HF_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as in Hugging Face's `rope_scaling` ("linear" or "llama3")."""

    rope_type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(
                f"rope_scaling type {self.rope_type!r} is not supported "
                "(supported: 'linear', 'llama3')"
            )
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError("rope_scaling.high_freq_factor must be > low_freq_factor")


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(default="tiny", metadata={"help": "model name (preset name or checkpoint)"})
    vocab_size: int = field(default=4096, metadata={"help": "vocabulary size"})
    hidden_size: int = field(default=256, metadata={"help": "model width"})
    num_layers: int = field(default=4, metadata={"help": "decoder layers"})
    num_heads: int = field(default=8, metadata={"help": "query heads"})
    num_kv_heads: int = field(default=2, metadata={"help": "key/value heads (GQA)"})
    intermediate_size: int = field(default=688, metadata={"help": "SwiGLU MLP width"})
    rope_theta: float = field(default=10000.0, metadata={"help": "RoPE base"})
    rms_norm_eps: float = field(default=1e-5, metadata={"help": "RMSNorm epsilon"})
    max_position_embeddings: int = field(default=4096, metadata={"help": "longest context"})
    dtype: str = field(default="float32", metadata={"help": "float32 | float16 | bfloat16"})
    seed: int = field(default=0, metadata={"help": "seed of the random weights"})
    eos_token_id: int = field(default=2, metadata={"help": "end-of-sequence token id"})
    tie_word_embeddings: bool = field(default=False, metadata={"help": "lm_head shares embeddings"})
    rope_scaling: RopeScaling | None = field(default=None, metadata={"help": "RoPE scaling"})

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_SIZES)}, got {self.dtype!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(
                f"eos_token_id ({self.eos_token_id}) must be in [0, vocab_size={self.vocab_size})"
            )
        if isinstance(self.rope_scaling, dict):  # from_json hands the nested dict over as-is
            known = {f.name for f in dataclasses.fields(RopeScaling)}
            unknown = sorted(set(self.rope_scaling) - known)
            if unknown:
                raise ValueError(
                    f"unknown rope_scaling keys {unknown}; valid keys: {sorted(known)}"
                )
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))

    # ---- derived sizes -------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def dtype_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def torch_dtype(self):  # -> torch.dtype; torch imported lazily
        import torch

        return getattr(torch, self.dtype)

    def kv_bytes_per_token_per_layer(self) -> int:
        """Bytes of K plus V for one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_size

    def kv_bytes_per_token(self) -> int:
        """Bytes of K plus V for one token across all layers."""
        return self.num_layers * self.kv_bytes_per_token_per_layer()

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes one KV block (block_size tokens, K and V, all layers) occupies."""
        return block_size * self.kv_bytes_per_token()

    @property
    def num_parameters(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attn + mlp + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * per_layer + embeddings + lm_head + self.hidden_size

    @property
    def weights_bytes(self) -> int:
        """Bytes of the weights in ``dtype``."""
        return self.num_parameters * self.dtype_size

    # ---- constructors ----------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; available: {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Fields by name; missing ones take the `tiny` defaults, unknown ones are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig keys {unknown}; valid keys: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """A JSON file of ModelConfig fields, or a Hugging Face Llama config.json."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        if "model_type" in data or "architectures" in data:
            return cls.from_hf_config(data)
        return cls.from_dict(data)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], name: str | None = None) -> ModelConfig:
        """A Hugging Face Llama `config.json` (as a dict)."""
        model_type = hf.get("model_type", "llama")
        if model_type != "llama":
            raise ValueError(f"only Llama checkpoints are supported, got model_type={model_type!r}")
        for flag in ("attention_bias", "mlp_bias"):
            if hf.get(flag):
                raise ValueError(f"Llama configs with {flag}=true are not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {hf['hidden_act']!r}")
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim")
        if head_dim is not None and head_dim * num_heads != hf["hidden_size"]:
            raise ValueError(
                f"head_dim={head_dim} != hidden_size/num_attention_heads "
                f"({hf['hidden_size']}/{num_heads}) is not supported"
            )
        eos = hf.get("eos_token_id", 2)
        if isinstance(eos, list):  # Llama 3 lists several; the first is the end-of-text token
            eos = eos[0]
        dtype = _HF_DTYPES.get(str(hf.get("torch_dtype", hf.get("dtype", "float32"))), "float32")
        # transformers 5 writes RoPE as `rope_parameters` (rope_theta inside, rope_type
        # "default" when unscaled) instead of top-level `rope_theta` and `rope_scaling`.
        rope_parameters: dict[str, Any] = hf.get("rope_parameters") or {}
        scaling: dict[str, Any] = hf.get("rope_scaling") or rope_parameters
        rope_theta = hf.get("rope_theta", rope_parameters.get("rope_theta", 10000.0))
        rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
        rope_scaling = None
        if rope_type != "default":
            params = {
                k: scaling[k]
                for k in (
                    "factor",
                    "low_freq_factor",
                    "high_freq_factor",
                    "original_max_position_embeddings",
                )
                if k in scaling
            }
            rope_scaling = RopeScaling(rope_type=rope_type, **params)
        return cls(
            name=name or hf.get("_name_or_path") or "hf-llama",
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            intermediate_size=hf["intermediate_size"],
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            dtype=dtype,
            eos_token_id=eos,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=rope_scaling,
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The Hugging Face Llama `config.json` describing this model."""
        hf: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "_name_or_path": self.name,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": self.dtype,
            "bos_token_id": 1,
            "eos_token_id": self.eos_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "rope_scaling": None,
        }
        if self.rope_scaling is not None:
            hf["rope_scaling"] = dataclasses.asdict(self.rope_scaling)
        return hf


PRESETS: dict[str, ModelConfig] = {
    # A decode step at batch 32, context ~256 takes a few ms on 2 CPU cores.
    "tiny": ModelConfig(),
    # A larger model for GPUs (~200M parameters).
    "small": ModelConfig(
        name="small",
        vocab_size=32000,
        hidden_size=1024,
        num_layers=12,
        num_heads=16,
        num_kv_heads=4,
        intermediate_size=2816,
    ),
    # The geometry of Meta's Llama-3-8B (its config.json), random weights in bf16: on a
    # GPU the KV pool sized by --gpu-memory-utilization then holds what a real 8B
    # deployment's does (128 KiB per token), and the scheduler meets real memory pressure.
    "llama3-8b": ModelConfig(
        name="llama3-8b",
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        dtype="bfloat16",
        eos_token_id=128001,
    ),
}

#: Presets too large to run on a CPU: loading one anywhere but on CUDA is refused,
#: naming the memory it would need (:func:`require_cuda_for`).
CUDA_ONLY_PRESETS = frozenset({"llama3-8b"})


class ModelDoesNotFitError(ValueError):
    """A model was asked for on a device it cannot run on; the message says why."""


def require_cuda_for(config: ModelConfig, device_type: str) -> None:
    """Raise :class:`ModelDoesNotFitError` when ``config`` is a CUDA-only preset and
    ``device_type`` is not ``cuda``; the message names the memory it would need."""
    if config.name not in CUDA_ONLY_PRESETS or device_type == "cuda":
        return
    raise ModelDoesNotFitError(
        f"model preset {config.name!r} runs on CUDA only: its weights alone need "
        f"{config.weights_bytes / 1e9:.1f} GB ({config.num_parameters / 1e9:.2f} B parameters "
        f"in {config.dtype}), and its KV cache {config.kv_bytes_per_token() // 1024} KiB per "
        f"token, on top; on a {device_type} use 'tiny' or 'small'"
    )
