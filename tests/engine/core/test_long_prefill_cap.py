"""vLLM 0.32's ``--long-prefill-token-threshold`` (and its adaptive floor) in the bundled
scheduler: while another request runs or waits, no request computes more than the
threshold in one step; alone, a request takes the whole budget; the adaptive flag floors
the cap at the token budget over the requests running and waiting. Read from vLLM
0.32's ``vllm/v1/core/sched/scheduler.py`` (``schedule``)."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.factory import build_simulated_engine


def _engine(**knobs):
    config = EngineConfig(
        SchedulerConfig(max_num_batched_tokens=512, **knobs),
        CacheConfig(num_gpu_blocks_override=1024, enable_prefix_caching=False),
    )
    return build_simulated_engine(config, CostModel.constant(0.01))


def _add(engine, name: str, prompt: int, at: float = 0.0) -> None:
    engine.add_request(
        EngineRequest(name, list(range(1, prompt + 1)), SamplingParams(max_tokens=4), at)
    )


def _chunks(engine, steps: int) -> list[dict[str, int]]:
    """Per step, each scheduled request's tokens."""
    seen = []
    for _ in range(steps):
        record = engine.step()
        seen.append({e.request_id: e.num_scheduled_tokens for e in record.scheduled})
    return seen


def test_a_long_prompt_is_cut_to_the_threshold_while_another_request_waits_or_runs():
    engine = _engine(long_prefill_token_threshold=100)
    _add(engine, "long", 450)
    _add(engine, "short", 30)
    chunks = _chunks(engine, 3)
    # both admitted in the first step: the long one capped, the short one whole
    assert chunks[0] == {"long": 100, "short": 30}
    # the short one decodes beside it; the long one goes on 100 tokens a step
    assert chunks[1] == {"short": 1, "long": 100} and chunks[2]["long"] == 100


def test_a_request_alone_takes_the_whole_budget():
    engine = _engine(long_prefill_token_threshold=100)
    _add(engine, "alone", 450)
    assert _chunks(engine, 1) == [{"alone": 450}]


def test_without_the_threshold_the_budget_alone_cuts():
    engine = _engine()
    _add(engine, "long", 450)
    _add(engine, "short", 30)
    assert _chunks(engine, 1) == [{"long": 450, "short": 30}]


def test_the_adaptive_floor_is_the_budget_over_the_requests():
    engine = _engine(long_prefill_token_threshold=100, long_prefill_token_threshold_adaptive=True)
    _add(engine, "a", 450)
    _add(engine, "b", 450)
    # two requests: the cap is max(100, 512 // 2) = 256 each
    assert _chunks(engine, 1) == [{"a": 256, "b": 256}]
    assert engine.scheduler.long_prefill_cap() == 256


@pytest.mark.parametrize(
    ("knobs", "words"),
    [
        ({"long_prefill_token_threshold": -1}, "from 0 to max_model_len"),
        ({"long_prefill_token_threshold": 4096}, "from 0 to max_model_len (2048)"),
        (
            {"long_prefill_token_threshold": 64, "enable_chunked_prefill": False},
            "needs enable_chunked_prefill",
        ),
    ],
)
def test_bad_thresholds_are_refused_with_the_reason(knobs, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        SchedulerConfig(**knobs)
