"""The identity of an external engine a cost model was fitted for (``schedscope
calibrate --from-run``), and what simulating it means.

A fit of a target stands for *that* engine: its name and version (``/version``, and
``/v1/models``' ``owned_by``), the model it served, the knobs it was started with (vLLM's
flag names), its KV cache (block size and blocks, from ``vllm:cache_config_info``) and the
machine the load ran from (its client latency is in the fit). Never this machine's
fingerprint (:mod:`harness.costmodel.machine`): the store keeps it apart, as
``cost-model-target-<key>.json``, found by ``target:<name>`` or ``target:<key>``.

Simulating a target uses its semantics where they differ from the bundled engine's
defaults (:func:`simulate_knobs`): vLLM V1 preempts by recompute only, prefills in chunks,
caches prefixes, and starts with its own defaults for the batch knobs.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass, fields

#: The fingerprint dict's ``kind`` of a target fit (a machine's has none).
TARGET_KIND = "target"

#: vLLM's flag -> the bundled engine's knob it maps to, for the simulation. A target's
#: other flags are part of its identity and are not simulated (listed as such).
VLLM_FLAG_KNOBS = {
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-model-len": "max_model_len",
    "--block-size": "block_size",
    "--num-gpu-blocks-override": "num_gpu_blocks_override",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--enable-chunked-prefill": "enable_chunked_prefill",
    "--scheduling-policy": "scheduling_policy",
    "--watermark": "watermark",
    # vLLM 0.32's admission caps (a 503 beyond them)
    "--max-num-queued-reqs": "max_num_queued_reqs",
    "--max-num-queued-tokens": "max_num_queued_tokens",
    # vLLM 0.32's cap on one request's prefill chunk while others run or wait
    "--long-prefill-token-threshold": "long_prefill_token_threshold",
    "--long-prefill-token-threshold-adaptive": "long_prefill_token_threshold_adaptive",
    # vLLM V0's (and the bundled engine's); V1 has neither
    "--preemption-mode": "preemption_mode",
    "--swap-space": "swap_space",
}
#: The knobs' types, to read a flag's text.
_INT_KNOBS = {
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "num_gpu_blocks_override",
    "max_num_queued_reqs",
    "max_num_queued_tokens",
    "long_prefill_token_threshold",
}
_BOOL_KNOBS = {
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "long_prefill_token_threshold_adaptive",
}
_FLOAT_KNOBS = {"watermark", "swap_space"}

#: vLLM V1's semantics where they differ from the bundled engine's defaults (vLLM 0.32
#: and 0.34, read from their wheels): recompute-only preemption (no swap space),
#: chunked prefill and prefix caching on, no watermark.
VLLM_V1_SEMANTICS = {
    "preemption_mode": "recompute",
    "swap_space": 0.0,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "watermark": 0.0,
}
#: vLLM's OpenAI server's batch defaults when the flags are not given, by platform
#: (vllm/engine/arg_utils.py get_batch_defaults, 0.32): GPUs under 70 GiB (and any
#: platform it cannot read). CPU: 128 seqs; H100/H200: 1024 seqs, 8192 tokens; >= 160 GiB:
#: 1024, 16384. The platform is not visible from outside, so these are *assumed* and
#: said so: give ``--target-knobs`` for the truth.
VLLM_ASSUMED_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}


class TargetError(ValueError):
    """A target's identity cannot be read or is inconsistent; the message says why."""


def parse_knobs(text: str) -> dict[str, str]:
    """``--target-knobs "--max-num-seqs 64 --enable-prefix-caching ..."`` as flag ->
    value text (``--flag=value``, ``--flag value``, a bare ``--flag``: "true",
    ``--no-flag``: ``--flag`` "false"), in vLLM's spelling (underscores read as dashes).
    TargetError names anything else."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise TargetError(f"cannot read {text!r}: {exc}") from None
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or len(word) < 3:
            raise TargetError(f"expected a flag such as --max-num-seqs, got {word!r}")
        flag, eq, value = word.partition("=")
        flag = flag.replace("_", "-").lower()
        if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
            raise TargetError(f"not a flag name: {word!r}")
        if not eq:
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                value = words[i + 1]
                i += 1
            elif flag.startswith("--no-"):
                flag, value = "--" + flag[5:], "false"
            else:
                value = "true"
        out[flag] = value
        i += 1
    return out


def knob_value(knob: str, text: str):
    """A flag's text as the bundled engine's ``knob`` takes it; TargetError names it."""
    try:
        if knob in _INT_KNOBS:
            return int(text)
        if knob in _FLOAT_KNOBS:
            return float(text)
        if knob in _BOOL_KNOBS:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "1")
    except ValueError:
        raise TargetError(f"{knob.replace('_', '-')}: cannot read {text!r}") from None
    return text


@dataclass(frozen=True)
class TargetFingerprint:
    """An external engine a fit stands for. Every field is part of ``key``."""

    #: "vllm", "schedscope", else what /v1/models' owned_by says ("unknown": nothing)
    engine: str
    #: /version's "version" ("unknown" when it says none)
    version: str
    served_model: str
    #: the knobs it was started with, vLLM's flag -> value text, sorted
    knobs: tuple[tuple[str, str], ...]
    block_size: int | None
    kv_blocks: int | None
    #: the machine the load ran from (its CPU and cores): the client latency is its
    load_machine: str

    @property
    def key(self) -> str:
        """12 hex digits over every part."""
        text = json.dumps(self.parts(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        """The name ``target:<name>`` finds it by: engine, version and model."""
        raw = f"{self.engine}-{self.version}-{self.served_model}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)[:120]

    def parts(self) -> dict:
        out = asdict(self)
        out["knobs"] = [list(pair) for pair in self.knobs]
        return out

    def knob_dict(self) -> dict[str, str]:
        return dict(self.knobs)

    def describe(self) -> str:
        knobs = " ".join(f"{flag} {value}" for flag, value in self.knobs) or "no knobs recorded"
        cache = (
            f"block size {self.block_size}, {self.kv_blocks:,} KV blocks"
            if self.block_size and self.kv_blocks
            else "KV cache not read"
        )
        return (
            f"{self.engine} {self.version} serving {self.served_model} ({knobs}; {cache}); "
            f"load from {self.load_machine} [target:{self.name}, key {self.key}]"
        )

    def to_dict(self, simulate: dict | None = None, assumed: list[str] | None = None) -> dict:
        """The store's fingerprint entry: the parts, ``kind``, ``key``, ``name``, and the
        knobs the simulation takes (``simulate_knobs``) with those it assumed."""
        return {
            **self.parts(),
            "kind": TARGET_KIND,
            "key": self.key,
            "name": self.name,
            "simulate_knobs": simulate if simulate is not None else {},
            "assumed_knobs": assumed or [],
        }

    @classmethod
    def from_dict(cls, data: dict) -> TargetFingerprint:
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data))
        if missing:
            raise TargetError(f"target fingerprint lacks {missing}")
        values = {k: data[k] for k in names}
        knobs = values["knobs"]
        if not isinstance(knobs, list) or not all(
            isinstance(p, list | tuple) and len(p) == 2 for p in knobs
        ):
            raise TargetError(f"target fingerprint knobs must be [flag, value] pairs: {knobs!r}")
        values["knobs"] = tuple((str(a), str(b)) for a, b in knobs)
        return cls(**values)


def is_target(fingerprint: dict) -> bool:
    """Whether a stored model's fingerprint dict is a target's."""
    return isinstance(fingerprint, dict) and fingerprint.get("kind") == TARGET_KIND


def simulate_knobs(
    engine: str,
    knobs: dict[str, str],
    block_size: int | None,
    kv_blocks: int | None,
    max_model_len: int | None,
    prefix_caching: bool | None,
) -> tuple[dict, list[str], list[str]]:
    """(the bundled engine's knob values that simulate this target, the knobs assumed
    rather than read, the target's flags not simulated). A vLLM target takes vLLM V1's
    semantics (:data:`VLLM_V1_SEMANTICS`), then its batch defaults
    (:data:`VLLM_ASSUMED_DEFAULTS`, assumed) where its flags do not say; then its flags;
    then what its metrics said (block size, KV blocks, prefix caching) and
    ``max_model_len`` (/v1/models)."""
    out: dict = {}
    assumed: list[str] = []
    if engine == "vllm":
        out.update(VLLM_V1_SEMANTICS)
        for knob, value in VLLM_ASSUMED_DEFAULTS.items():
            out[knob] = value
            assumed.append(knob)
    not_simulated: list[str] = []
    for flag, text in knobs.items():
        found = VLLM_FLAG_KNOBS.get(flag)
        if found is None:
            not_simulated.append(flag)
            continue
        out[found] = knob_value(found, text)
        if found in assumed:
            assumed.remove(found)
    if block_size:
        out["block_size"] = block_size
    if kv_blocks:
        out["num_gpu_blocks_override"] = kv_blocks
    if prefix_caching is not None:
        out["enable_prefix_caching"] = prefix_caching
    if max_model_len:
        out.setdefault("max_model_len", max_model_len)
    return out, assumed, not_simulated
