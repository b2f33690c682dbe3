"""An external engine's identity (harness/costmodel/target.py): its knobs as vLLM spells
them, what simulating it means, its key and name, and its fits in the store."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.core.cost_model import CostModel
from harness.costmodel import store as cost_store
from harness.costmodel.target import (
    TargetError,
    TargetFingerprint,
    parse_knobs,
    simulate_knobs,
)

TARGET = TargetFingerprint(
    engine="vllm",
    version="0.32.0",
    served_model="meta/llama 3",
    knobs=(("--max-num-seqs", "64"),),
    block_size=16,
    kv_blocks=1000,
    load_machine="Test CPU, 2 cores",
)


def test_knobs_read_as_vllm_spells_them():
    assert parse_knobs(
        "--max-num-seqs 64 --max_num_batched_tokens=4096 --enable-prefix-caching "
        "--no-enable-chunked-prefill --scheduling-policy priority"
    ) == {
        "--max-num-seqs": "64",
        "--max-num-batched-tokens": "4096",
        "--enable-prefix-caching": "true",
        "--enable-chunked-prefill": "false",
        "--scheduling-policy": "priority",
    }
    assert parse_knobs("") == {}
    for bad, why in (
        ("max-num-seqs 64", "expected a flag"),
        ("--max-num-seqs '64", "cannot read"),
        ("--max-num-seqs 64 stray", "expected a flag"),
        ("--a$b 1", "not a flag name"),
    ):
        with pytest.raises(TargetError, match=why):
            parse_knobs(bad)


def test_a_vllm_target_is_simulated_with_v1_semantics_its_flags_and_its_cache():
    knobs, assumed, not_simulated = simulate_knobs(
        "vllm",
        {"--max-num-seqs": "64", "--gpu-memory-utilization": "0.9"},
        block_size=16,
        kv_blocks=1000,
        max_model_len=4096,
        prefix_caching=False,
    )
    assert knobs["preemption_mode"] == "recompute" and knobs["swap_space"] == 0.0
    assert knobs["enable_chunked_prefill"] is True
    assert knobs["enable_prefix_caching"] is False  # its metrics said so
    assert knobs["max_num_seqs"] == 64 and knobs["max_num_batched_tokens"] == 2048
    assert (knobs["block_size"], knobs["num_gpu_blocks_override"]) == (16, 1000)
    assert knobs["max_model_len"] == 4096
    assert assumed == ["max_num_batched_tokens"]
    assert not_simulated == ["--gpu-memory-utilization"]
    with pytest.raises(TargetError, match="max-num-seqs: cannot read 'many'"):
        simulate_knobs("vllm", {"--max-num-seqs": "many"}, None, None, None, None)


def test_another_engine_takes_only_what_it_said():
    knobs, assumed, _ = simulate_knobs("sglang", {"--max-num-seqs": "8"}, None, None, None, None)
    assert knobs == {"max_num_seqs": 8} and assumed == []


def test_the_key_covers_every_part_and_the_name_is_a_plain_word():
    assert TARGET.name == "vllm-0.32.0-meta_llama_3"
    assert (
        len(
            {TARGET.key}
            | {
                dataclasses.replace(TARGET, **{name: value}).key
                for name, value in (
                    ("engine", "sglang"),
                    ("version", "0.34.0"),
                    ("served_model", "other"),
                    ("knobs", (("--max-num-seqs", "32"),)),
                    ("block_size", 32),
                    ("kv_blocks", 999),
                    ("load_machine", "Other CPU, 8 cores"),
                )
            }
        )
        == 8
    )
    back = TargetFingerprint.from_dict(json.loads(json.dumps(TARGET.to_dict())))
    assert back == TARGET and back.key == TARGET.key


def test_the_store_keeps_target_fits_apart_and_finds_the_newest(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path))
    old = dataclasses.replace(CostModel(), fitted_at="2026-12-01T00:00:00+00:00")
    new = dataclasses.replace(CostModel(step_overhead_s=0.5), fitted_at="2026-12-02T00:00:00+00:00")
    other = dataclasses.replace(TARGET, knobs=(("--max-num-seqs", "32"),))
    cost_store.save_target(old, other.to_dict(), other)
    path = cost_store.save_target(new, TARGET.to_dict({"max_num_seqs": 64}), TARGET)
    found = cost_store.find_target(TARGET.name)
    assert found.path == path and found.model.step_overhead_s == 0.5
    assert found.simulate_knobs == {"max_num_seqs": 64}
    assert cost_store.find_target(other.key).target == other
    (tmp_path / "cost-model-target-bad.json").write_text(
        json.dumps({**CostModel().to_dict(), "fingerprint": {"kind": "target", "engine": "x"}})
    )
    bad = cost_store.load(tmp_path / "cost-model-target-bad.json")
    assert bad.target is None and "unreadable target fingerprint" in bad.problem
    with pytest.raises(LookupError, match="no stored fit of target 'nope'.*vllm-0.32.0"):
        cost_store.find_target("nope")


def test_a_vllm_targets_long_prefill_cap_is_simulated_and_builds_a_scheduler():
    from engine.config import SchedulerConfig

    given = parse_knobs(
        "--long-prefill-token-threshold 256 --long-prefill-token-threshold-adaptive"
    )
    knobs, _, not_simulated = simulate_knobs("vllm", given, 16, 1000, 2048, None)
    assert not not_simulated
    assert knobs["long_prefill_token_threshold"] == 256
    assert knobs["long_prefill_token_threshold_adaptive"] is True
    scheduler = {k: v for k, v in knobs.items() if k in SchedulerConfig.__dataclass_fields__}
    assert SchedulerConfig(**scheduler).long_prefill_token_threshold == 256
