"""A small Llama-architecture decoder (RMSNorm, RoPE, GQA, SwiGLU) over a paged KV cache.

Module and parameter names follow Hugging Face's `LlamaForCausalLM`, so a checkpoint's
state dict loads as is (see `engine.worker.weights`). Weights are random from `config.seed` by
default: the tokens mean nothing, the compute is real.

The KV cache and a step's attention metadata are in `engine.worker.attention_metadata`,
attention over the cache in `engine.worker.paged_attention`; the dense reference paths
the model is checked against, in `engine.worker.dense_reference`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.worker.attention_metadata import (
    AttentionMetadata,
    DecodeMetadata,
    KVCache,
    PrefillMetadata,
    allocate_kv_cache,
)
from engine.worker.model_config import ModelConfig, RopeScaling, require_cuda_for
from engine.worker.paged_attention import (
    AttendFn,
    PagedAttention,
    Workspace,
    default_attention_impl,
)

__all__ = [
    "AttendFn",
    "AttentionMetadata",
    "DecodeMetadata",
    "KVCache",
    "LlamaForCausalLM",
    "PagedAttention",
    "PrefillMetadata",
    "Workspace",
    "allocate_kv_cache",
    "build_model",
    "empty_model",
]

INIT_STD = 0.02
#: Above this many parameters, random weights on CUDA are drawn on the device.
DEVICE_DRAW_MIN_PARAMETERS = 1_000_000_000


# ---- layers -------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:  # one fused op, same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 and cast back before scaling, as Hugging Face's LlamaRMSNorm.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> Tensor:
    """`[head_dim / 2]` float32 inverse frequencies, with `rope_scaling` applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is not None:
        inv_freq = _scale_inv_freq(inv_freq, scaling)
    return inv_freq


def _scale_inv_freq(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # "llama3": long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate `x [T, heads, head_dim]` by position; `cos`/`sin` are `[T, 1, head_dim / 2]`.

    Hugging Face's "rotate_half" convention: dimension `i` pairs with `i + head_dim / 2`.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = hd = config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, m, bias=False)
        self.up_proj = nn.Linear(d, m, bias=False)
        self.down_proj = nn.Linear(m, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attend)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder. `forward` runs one engine step over the paged KV cache."""

    inv_freq: Tensor  # a non-persistent buffer (register_buffer in __init__)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.scale = config.head_dim**-0.5
        self.workspace = Workspace()
        #: "gather" or "sdpa" (engine/worker/paged_attention.py); None: the device's default.
        self.attention_impl: str | None = None

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin `[T, 1, head_dim / 2]` in the model's dtype (computed in float32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        dtype = self.lm_head.weight.dtype
        return freqs.cos()[:, None, :].to(dtype), freqs.sin()[:, None, :].to(dtype)

    def hidden_states(
        self, input_ids: Tensor, positions: Tensor, attend: Callable[[int], AttendFn]
    ) -> Tensor:
        """Final-normed hidden states `[T, hidden]`; `attend(layer_idx)` does attention."""
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rope(positions)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, attend(i))
        return self.model.norm(h)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: KVCache,
        attn_metadata: AttentionMetadata,
        workspace: Workspace | None = None,
    ) -> Tensor:
        """input_ids, positions `[T]` -> float32 logits `[K, vocab]` at `logits_indices`.

        Writes the new tokens' K/V into `kv_caches` at `attn_metadata.slot_mapping`.
        `workspace`: the gather buffers to use (default: the model's own).
        """
        h = self.last_hidden(input_ids, positions, kv_caches, attn_metadata, workspace)
        return self.logits(h)

    @torch.inference_mode()
    def last_hidden(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: KVCache,
        attn_metadata: AttentionMetadata,
        workspace: Workspace | None = None,
    ) -> Tensor:
        """`forward` up to the final norm: hidden states `[K, hidden]` at
        `logits_indices` (what a CUDA graph captures: its output stays small)."""
        paged = PagedAttention(
            self.config,
            kv_caches,
            attn_metadata,
            self.scale,
            self.lm_head.weight.dtype,
            workspace or self.workspace,
            self.attention_impl or default_attention_impl(self.device),
        )
        h = self.hidden_states(input_ids, positions, paged.for_layer)
        return h[attn_metadata.logits_indices]

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """float32 logits `[K, vocab]` of final-normed hidden states `[K, hidden]`."""
        return self.lm_head(hidden).float()


# ---- construction -------------------------------------------------------------------------


def build_model(config: ModelConfig, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A model with deterministic random weights from `config.seed`, in `config.dtype`.

    Weights are drawn on the CPU in float32, in parameter order, then cast and moved: the
    same seed gives the same weights on every device. A model of over
    `DEVICE_DRAW_MIN_PARAMETERS` on CUDA draws its weights on the device instead, in
    its dtype, from a CUDA generator of the same seed (deterministic on that device):
    drawing 8 B float32 values on the host would take minutes and 32 GB.
    A CUDA-only preset (`llama3-8b`) on any other device raises
    `ModelDoesNotFitError`, naming the memory it would need.
    """
    device = torch.device(device)
    require_cuda_for(config, device.type)
    model = empty_model(config, device)
    on_device = device.type == "cuda" and config.num_parameters > DEVICE_DRAW_MIN_PARAMETERS
    generator = torch.Generator(device if on_device else "cpu").manual_seed(config.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied lm_head is listed once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif on_device:
                param.normal_(0.0, INIT_STD, generator=generator)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
    return model


def empty_model(config: ModelConfig, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A model with uninitialised weights in `config.dtype` on `device` (no init cost)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=config.torch_dtype).to_empty(device=device)
    model.tie_weights()  # to_empty() gives each module its own tensor
    model.inv_freq = rope_inv_freq(config).to(device)  # RoPE frequencies stay float32
    return model.requires_grad_(False).eval()  # inference only
