"""The saturation probe (``run --target URL --rate-scale auto``) against a served engine
whose capacity is known: the ``sim`` executor sleeping a constant step time."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.loadgen.saturation_probe import ProbeError, probe_capacity
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass
from harness.serve.local_server import CliServer
from harness.simulate.capacity import simulated_capacity

pytestmark = [pytest.mark.slow]

#: Long enough that the server's own work per step (a few ms, more on a busy machine: a
#: 30 ms step probed 16% slow beside other tests) is small beside it.
STEP_S = 0.1
MAX_NUM_SEQS = 32

PROFILE = Profile(
    name="known",
    seed=5,
    classes=(
        RequestClass(
            name="only",
            prompt_tokens=LengthDistribution.fixed(8),
            output_tokens=LengthDistribution.uniform(10, 30),
        ),
    ),
    phases=(Phase(name="base", duration_s=60.0, rate=5.0),),
)


def test_the_probe_measures_the_capacity_the_simulator_predicts(tmp_path):
    # 32 sequences at a time, 100 ms a step, 20 tokens a request on average: about
    # 32 / (20 x 100 ms) = 16 requests/s; the probe's 32 streams fill the batch.
    cost = tmp_path / "cost.json"
    model = CostModel.constant(STEP_S)
    model.save(cost)
    args = ["--executor", "sim", "--cost-model", str(cost), "--max-num-seqs", str(MAX_NUM_SEQS)]
    config = EngineConfig(model="tiny", scheduler=SchedulerConfig(max_num_seqs=MAX_NUM_SEQS))
    predicted = simulated_capacity(PROFILE, config, model).requests_per_s
    assert predicted == pytest.approx(MAX_NUM_SEQS / (20 * STEP_S), rel=0.1)
    with CliServer(args) as server:
        measured = probe_capacity(
            server.url, PROFILE, prompt_mode="token_ids", streams=MAX_NUM_SEQS,
            warmup_s=2.0, measure_s=6.0, drain_s=15.0,
        )  # fmt: skip
    print(f"predicted {predicted:.1f} req/s, probed {measured.requests_per_s:.1f} req/s")
    assert measured.method == "probe"
    assert f"{MAX_NUM_SEQS} concurrent streams" in measured.how
    # the served steps take a little more than the sleep (the server's own work)
    assert measured.requests_per_s == pytest.approx(predicted, rel=0.15)


def test_a_target_that_answers_nothing_is_no_capacity(tmp_path):
    with pytest.raises(ProbeError):
        probe_capacity(
            "http://127.0.0.1:9", PROFILE, prompt_mode="token_ids", streams=2,
            warmup_s=0.2, measure_s=0.5, drain_s=1.0, timeout_s=2.0,
        )  # fmt: skip


def test_locusts_auto_rate_scale_becomes_the_factor_every_process_uses(tmp_path):
    import argparse

    from harness.loadgen.relative_rate import rate_scale_arg, resolve_auto
    from harness.profiles.rate_scale import offered_rate

    assert rate_scale_arg("1.5") == 1.5 and rate_scale_arg("auto") == "auto:0.8"
    with pytest.raises(argparse.ArgumentTypeError, match="F must be in"):
        rate_scale_arg("auto:0")
    cost = tmp_path / "cost.json"
    CostModel.constant(STEP_S).save(cost)
    args = ["--executor", "sim", "--cost-model", str(cost), "--max-num-seqs", str(MAX_NUM_SEQS)]
    parsed = argparse.Namespace(rate_scale="auto:0.5", prompt_mode="token_ids", seed=-1)
    with CliServer(args) as server:
        chosen = resolve_auto(
            parsed, PROFILE, server.url, streams=MAX_NUM_SEQS, warmup_s=2.0, measure_s=4.0,
            drain_s=15.0,
        )  # fmt: skip
    assert chosen is not None and chosen.method == "probe"
    assert parsed.rate_scale == chosen.factor
    assert offered_rate(PROFILE.with_rate_scale(parsed.rate_scale)) == pytest.approx(
        0.5 * chosen.capacity_rps
    )
    # a factor is left as it is, and nothing is probed
    assert resolve_auto(argparse.Namespace(rate_scale=2.0), PROFILE, "http://127.0.0.1:9") is None
