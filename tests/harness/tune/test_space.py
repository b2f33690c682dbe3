"""The search space (harness/tune/space.py): the defaults, --space files, skipped
combinations."""

import optuna
import pytest

from harness.serve.knobs import build_engine_config, knob_defaults
from harness.tune.space import DEFAULT_PARAMS, Space, SpaceError, skip_reason, space_from_dict


def _suggest(space: Space, seed: int, current: dict | None = None) -> dict:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return space.suggest(study.ask(), current or knob_defaults())


def test_default_space_covers_the_scheduler_guides_knobs():
    assert {p.name for p in DEFAULT_PARAMS} == {
        "scheduling_policy",
        "aging_rate",
        "max_wait_s",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "gpu_memory_utilization",
        "swap_space",
        "preemption_mode",
    }


def test_suggestions_are_whole_configs_with_the_token_budget_on_blocks():
    for seed in range(20):
        knobs = _suggest(Space(), seed)
        assert set(knobs) == set(knob_defaults())
        assert knobs["max_num_batched_tokens"] % knobs["block_size"] == 0
        if knobs["scheduling_policy"] == "fcfs":
            # conditional knobs stay at the current config's values
            assert knobs["aging_rate"] == 0.0 and knobs["max_wait_s"] is None


def test_the_policy_is_searched_over_every_policy_and_lpm_ages_as_sjf_and_priority():
    policy = next(p for p in DEFAULT_PARAMS if p.name == "scheduling_policy")
    assert policy.choices == ("fcfs", "sjf", "priority", "lpm")
    for name in ("aging_rate", "max_wait_s"):
        param = next(p for p in DEFAULT_PARAMS if p.name == name)
        assert [c for c in policy.choices if param.applies({"scheduling_policy": c})] == [
            "sjf",
            "priority",
            "lpm",
        ]
    # a suggestion under lpm is a configuration the engine takes
    lpm = next(
        k for seed in range(200) if (k := _suggest(Space(), seed))["scheduling_policy"] == "lpm"
    )
    assert build_engine_config(lpm).scheduler.scheduling_policy == "lpm"


def test_none_choice_unsets_the_knob():
    space = space_from_dict({"base": "empty", "params": {"max-wait-s": {"choices": ["none"]}}})
    assert _suggest(space, 0, {**knob_defaults(), "max_wait_s": 3.0})["max_wait_s"] is None


def test_a_space_file_narrows_and_widens(tmp_path):
    space = space_from_dict(
        {
            "drop": ["swap_space", "preemption-mode"],
            "params": {"max_num_seqs": {"type": "int", "low": 8, "high": 2048, "log": True}},
        }
    )
    assert "swap_space" not in space.names and "preemption_mode" not in space.names
    seqs = next(p for p in space.params if p.name == "max_num_seqs")
    assert (seqs.low, seqs.high) == (8, 2048)
    assert space.names[0] == "scheduling_policy"


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"bogus": 1}, "unknown key"),
        ({"base": "nothing"}, "base"),
        ({"drop": ["model_len"]}, "drop.model_len: not an engine knob"),
        ({"base": "empty", "drop": ["swap_space"]}, "not a param of the empty space"),
        ({"params": {"max_num_seqs": {"type": "int", "low": 8}}}, "params.max_num_seqs.high"),
        ({"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 4}}}, "below high"),
        ({"params": {"swap_space": {"type": "float", "low": 0, "high": 1, "log": True}}}, "log"),
        ({"params": {"swap_space": {"choices": []}}}, "non-empty list"),
        ({"params": {"swap_space": {"choices": [1], "when": {"x": [1]}}}}, "when.x"),
        ({"base": "empty", "params": {}}, "searches no knob"),
    ],
)
def test_bad_space_files_name_the_key(data, names):
    with pytest.raises(SpaceError, match=names):
        space_from_dict(data)


def test_fixed_pools_make_their_memory_knobs_moot():
    current = {**knob_defaults(), "num_gpu_blocks_override": 384}
    assert "gpu_memory_utilization" not in Space().for_current(current).names
    assert "gpu_memory_utilization" in Space().for_current(knob_defaults()).names


def test_skip_reasons_are_counted_once_per_kind():
    from engine.config import ConfigError

    reasons = set()
    for tokens in (512, 1024):
        with pytest.raises(ConfigError) as exc:
            build_engine_config({"enable_chunked_prefill": False, "max_num_batched_tokens": tokens})
        reasons.add(skip_reason(str(exc.value)))
    assert len(reasons) == 1 and "max_num_batched_tokens (N)" in reasons.pop()
