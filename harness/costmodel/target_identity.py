"""A target's identity as a ``schedscope run --target`` cell recorded it: run.json's
``target_info`` (what ``/version`` and ``/v1/models`` said before and after the load:
harness/run/target_info.py) and ``target_knobs`` (``run --target-knobs``), and the
target's own configuration metrics in metrics.parquet (``vllm:cache_config_info``; the
bundled engine's ``schedscope_scheduler_config_info``). A target that changed between
the two reads, or whose configuration labels changed between scrapes, was restarted
mid-run: refused, naming what changed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness.costmodel.target import (
    TargetError,
    TargetFingerprint,
    parse_knobs,
    simulate_knobs,
)

#: The run.json keys a ``schedscope run --target`` cell writes for this fit.
TARGET_INFO_KEY = "target_info"
TARGET_KNOBS_KEY = "target_knobs"
#: The metric families whose labels say a target's configuration.
CACHE_CONFIG_INFO = "vllm:cache_config_info"
SCHEDULER_CONFIG_INFO = "schedscope_scheduler_config_info"
#: schedscope_scheduler_config_info's labels that are knobs, as vLLM-style flags.
_SCHEDULER_LABEL_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "max_model_len": "--max-model-len",
    "preemption_mode": "--preemption-mode",
    "max_num_queued_reqs": "--max-num-queued-reqs",
    "max_num_queued_tokens": "--max-num-queued-tokens",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "long_prefill_token_threshold_adaptive": "--long-prefill-token-threshold-adaptive",
}
_CACHE_LABEL_FLAGS = {"watermark": "--watermark", "swap_space": "--swap-space"}


def info_labels(metrics, family: str) -> tuple[dict | None, list[str]]:
    """(the labels of ``family``'s sample, the changes between scrapes as "label a -> b
    at T") from metrics.parquet; (None, []) when it was never scraped."""
    import polars as pl

    if metrics is None:
        return None, []
    rows = metrics.filter(pl.col("name") == family).sort("timestamp")
    seen: list[tuple[float, dict]] = []
    for t, text in zip(rows["timestamp"].to_list(), rows["labels"].to_list(), strict=True):
        try:
            labels = json.loads(text)
        except ValueError:
            continue
        if isinstance(labels, dict):
            seen.append((t, {str(k): str(v) for k, v in labels.items()}))
    if not seen:
        return None, []
    changes = []
    first = seen[0][1]
    for t, labels in seen[1:]:
        for name in sorted(set(first) | set(labels)):
            if first.get(name) != labels.get(name):
                changes.append(
                    f"{family} {name} {first.get(name)} -> {labels.get(name)} at {t:.0f}"
                )
        if changes:
            break
    return first, changes


#: Flags that are not part of a target's identity: the policy orders the same steps
#: (simulate and tune choose it with --policy).
NOT_IDENTITY = frozenset({"--scheduling-policy"})


@dataclass(frozen=True)
class TargetIdentity:
    fingerprint: TargetFingerprint
    #: the bundled engine's knobs that simulate the target, those assumed, and the
    #: target's flags the simulation does not model
    simulate: dict
    assumed: list[str]
    not_simulated: list[str]

    def fingerprint_dict(self) -> dict:
        return self.fingerprint.to_dict(self.simulate, self.assumed)


def load_machine(machine: dict) -> str:
    """The machine a load ran from, for a target's identity: its CPU and cores (from the
    fingerprint run.json records as ``machine``)."""
    return f"{machine.get('cpu_model', 'unknown cpu')}, {machine.get('cores', '?')} cores"


def _int_label(labels: dict | None, name: str) -> int | None:
    try:
        value = int(float((labels or {}).get(name, "")))
    except ValueError:
        return None
    return value if value > 0 else None


def _target_info(info: dict) -> tuple[dict, list[str]]:
    """(run.json's target_info as read before the load, its changes by the end)."""
    recorded = info.get(TARGET_INFO_KEY)
    if not isinstance(recorded, dict):
        return {}, []
    before = recorded.get("before")
    before = before if isinstance(before, dict) else {}
    after = recorded.get("after")
    after = after if isinstance(after, dict) else None
    changes = []
    if after:
        for name in ("engine", "version", "model", "max_model_len"):
            if after.get(name) is not None and before.get(name) != after.get(name):
                changes.append(f"{name} {before.get(name)} -> {after.get(name)}")
    return before, changes


def target_policy(info: dict, knobs_text: str | None = None) -> str:
    """The target's scheduling policy: its ``--scheduling-policy`` knob (given at the run
    or now), else fcfs (vLLM's default). TargetError when the knobs cannot be read."""
    knobs: dict[str, str] = {}
    recorded = info.get(TARGET_KNOBS_KEY)
    if isinstance(recorded, str) and recorded:
        knobs.update(parse_knobs(recorded))
    if knobs_text:
        knobs.update(parse_knobs(knobs_text))
    return knobs.get("--scheduling-policy", "fcfs")


def identity(info: dict, metrics, knobs_text: str | None = None) -> TargetIdentity:
    """The identity of the target of one cell (``info``: its run.json; ``metrics``: its
    metrics.parquet frame, None when nothing was scraped); ``knobs_text`` adds to the
    knobs the run recorded (vLLM's flags). TargetError when the target changed mid-run
    or a knob cannot be read."""
    before, info_changes = _target_info(info)
    cache, cache_changes = info_labels(metrics, CACHE_CONFIG_INFO)
    scheduler, scheduler_changes = info_labels(metrics, SCHEDULER_CONFIG_INFO)
    changes = info_changes + cache_changes + scheduler_changes
    if changes:
        raise TargetError(
            f"the target changed during the run ({'; '.join(changes)}): its steps are of "
            "two engines; fit a run of one"
        )
    names = set(metrics["name"].unique().to_list()) if metrics is not None else set()
    engine = str(before.get("engine") or "")
    if scheduler is not None or any(n.startswith("schedscope_") for n in names):
        engine = "schedscope"
    elif engine in ("", "unknown") and any(n.startswith("vllm:") for n in names):
        engine = "vllm"
    engine = engine or "unknown"
    knobs: dict[str, str] = {}
    for label, flag in _SCHEDULER_LABEL_FLAGS.items():
        value = (scheduler or {}).get(label)
        if value not in (None, "None"):
            knobs[flag] = value.lower() if value in ("True", "False") else value
    if engine == "schedscope":
        for label, flag in _CACHE_LABEL_FLAGS.items():
            value = (cache or {}).get(label)
            if value not in (None, "None"):
                knobs[flag] = value
    recorded = info.get(TARGET_KNOBS_KEY)
    try:
        if isinstance(recorded, str) and recorded:
            knobs.update(parse_knobs(recorded))
        if knobs_text:
            knobs.update(parse_knobs(knobs_text))
    except TargetError as exc:
        raise TargetError(f"--target-knobs: {exc}") from None
    for flag in NOT_IDENTITY:
        knobs.pop(flag, None)
    block_size = _int_label(cache, "block_size")
    kv_blocks = _int_label(cache, "num_gpu_blocks")
    caching = (cache or {}).get("enable_prefix_caching")
    prefix_caching = caching.lower() == "true" if caching in ("True", "False") else None
    max_model_len = before.get("max_model_len")
    max_model_len = max_model_len if isinstance(max_model_len, int) and max_model_len > 0 else None
    simulate, assumed, not_simulated = simulate_knobs(
        engine, knobs, block_size, kv_blocks, max_model_len, prefix_caching
    )
    machine = info.get("machine") if isinstance(info.get("machine"), dict) else {}
    fingerprint = TargetFingerprint(
        engine=engine,
        version=str(before.get("version") or "unknown"),
        served_model=str(before.get("model") or "unknown"),
        knobs=tuple(sorted(knobs.items())),
        block_size=block_size,
        kv_blocks=kv_blocks,
        load_machine=load_machine(machine if isinstance(machine, dict) else {}),
    )
    return TargetIdentity(fingerprint, simulate, assumed, not_simulated)
