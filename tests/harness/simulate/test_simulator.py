"""The simulator end to end: queueing theory as an oracle, determinism, the CLI."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.cli import app
from harness.profiles import build_plan, profile_from_dict, resolve_profile
from harness.records.decision_log import decisions_frame
from harness.simulate.driver import simulate

runner = CliRunner()


def flat(output: str) -> str:
    """CLI output without rich's box drawing and line wrapping."""
    for ch in "│╭╮╰╯─":
        output = output.replace(ch, " ")
    return " ".join(output.split())


def single_server_profile(rate: float, mean_output: float, duration_s: float, seed: int):
    """One class: 1-token prompts, geometric output lengths, Poisson arrivals."""
    return profile_from_dict(
        {
            "name": "mg1",
            "seed": seed,
            "classes": [
                {
                    "name": "only",
                    "weight": 1,
                    "prompt_tokens": {"kind": "fixed", "value": 1},
                    "output_tokens": {"kind": "geometric", "mean": mean_output},
                }
            ],
            "phases": [{"name": "poisson", "duration_s": duration_s, "rate": rate}],
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize("rate", [12.5, 15.0])
def test_fcfs_single_server_matches_pollaczek_khinchine(rate):
    """max_num_seqs=1, free prefill, a constant cost c per decode step, Poisson
    arrivals and geometric output lengths L (mean m) make the engine an M/G/1
    queue with service S = (L - 1) * c. Its mean response time is
    E[S] + lambda E[S^2] / (2 (1 - rho)) (Pollaczek-Khinchine)."""
    c, m = 0.01, 5.0
    p = 1 / m
    mean_s = c * (1 - p) / p  # E[L - 1] = (1 - p) / p
    mean_s2 = c * c * (1 - p) * (2 - p) / p**2  # E[(L - 1)^2]
    rho = rate * mean_s
    expected = mean_s + rate * mean_s2 / (2 * (1 - rho))

    cost = CostModel(
        step_overhead_s=0,
        prefill_token_s=0,
        decode_seq_s=c,
        decode_context_token_s=0,
        prefill_attention_s=0,
        swap_block_s=0,
        prefill_seq_s=0,
        mixed_step_s=0,
    )
    config = EngineConfig(SchedulerConfig(max_num_seqs=1))
    # ~60,000 requests: the estimate's standard error is well under 1%.
    profile = single_server_profile(rate, m, 60_000 / rate, seed=7)
    result = simulate(profile, config, cost, record_decisions=False)
    frame = result.requests
    assert frame["status"].eq("ok").all()
    measured = frame["e2e_s"].mean()
    assert measured == pytest.approx(expected, rel=0.03), (measured, expected, rho)
    # And the single server really served one request at a time, in arrival order.
    served = frame.sort("first_scheduled_at")
    assert served["scheduled_at"].is_sorted()
    assert (served["first_scheduled_at"].shift(-1) >= served["finished_at"]).drop_nulls().all()


def _simulate_cli(tmp_path, name, *extra):
    out = tmp_path / name
    result = runner.invoke(app, ["simulate", "--profile", "default", "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out


def test_same_seed_same_bytes(tmp_path):
    a = _simulate_cli(tmp_path, "a", "--policy", "all", "--num-requests", "600")
    b = _simulate_cli(tmp_path, "b", "--policy", "all", "--num-requests", "600")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 17  # 4 policies (fcfs, sjf, priority, lpm) x 4 files + the summary
    assert sorted({rel.parts[0] for rel in files if len(rel.parts) > 1}) == [
        "fcfs",
        "lpm",
        "priority",
        "sjf",
    ]
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    c = _simulate_cli(tmp_path, "c", "--policy", "all", "--num-requests", "600", "--seed", "43")
    assert (c / "fcfs/requests.parquet").read_bytes() != (a / "fcfs/requests.parquet").read_bytes()


def test_lpm_simulates_the_same_records_twice_and_ranks_its_re_hits():
    """Under lpm on a small KV pool with recompute preemption (a re-admitted request
    re-hits its own cached blocks: the simulator's prompts share nothing else), the
    same records twice, and admissions ranked by the cached length they found."""
    profile = resolve_profile("swap_pressure")
    config = EngineConfig(
        SchedulerConfig(scheduling_policy="lpm", preemption_mode="recompute"),
        CacheConfig(num_gpu_blocks_override=300),
    )
    a = simulate(profile, config, CostModel(), seed=7)
    b = simulate(profile, config, CostModel(), seed=7)
    assert a.num_steps == b.num_steps and a.requests.equals(b.requests, null_equal=True)
    assert a.steps is not None and b.steps is not None and a.steps.equals(b.steps)
    decisions = decisions_frame(a.decisions)
    assert decisions.equals(decisions_frame(b.decisions), null_equal=True)
    admitted = decisions.filter(pl.col("kind").is_in(["admit", "recompute"]))
    ranked = admitted.filter(pl.col("reason") == "policy_order")["lpm_cached_tokens"]
    assert ranked.null_count() == 0 and (ranked > 0).any()
    assert a.requests["status"].eq("ok").all()


def test_single_policy_layout_and_columns(tmp_path):
    out = _simulate_cli(tmp_path, "one", "--policy", "sjf", "--max-num-seqs", "64")
    frame = pl.read_parquet(out / "requests.parquet")
    for column in (
        "request_id",
        "policy",
        "profile",
        "class",
        "priority",
        "prompt_tokens",
        "output_tokens",
        "status",
        "error",
        "scheduled_at",
        "sent_at",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "max_itl_s",
        "queue_s",
        "preemptions",
        "preempt_swaps",
        "preempt_recomputes",
        "swapped_s",
        "recomputed_tokens",
        "stall_s",
    ):
        assert column in frame.columns, column
    assert frame["policy"].unique().to_list() == ["sjf"]
    assert frame["request_id"].n_unique() == frame.height
    plan = build_plan(resolve_profile("default"))
    assert frame.height == plan.num_open_requests  # nothing accepted is lost
    summary = json.loads((out / "summary.json").read_text())
    sjf = summary["policies"]["sjf"]
    assert sjf["config"]["scheduler"]["max_num_seqs"] == 64
    assert set(sjf["classes"]) == {"short_chat", "long_generation"}
    assert sjf["overall"]["counts"]["ok"] == frame.height
    decisions = pl.read_parquet(out / "decisions.parquet")
    assert decisions.filter(pl.col("kind") == "admit").height == frame.height


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "lifo"], "unknown policy lifo"),
        (["--max-num-batched-tokens", "100"], "multiple of block_size"),
        (["--max-num-seqs", "0"], "max_num_seqs must be >= 1"),
        (["--preemption-mode", "drop"], "drop"),
        (["--profile", "no-such-profile"], "no-such-profile"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
        (
            ["--gpu-memory-utilization", "0.01", "--device-memory", "0.1"],
            "no room for the KV cache",
        ),
        (["--model", "nope"], "unknown model preset 'nope'"),
    ],
)
def test_bad_input_is_named(tmp_path, args, message):
    result = runner.invoke(app, ["simulate", "--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    assert message in flat(result.output)


def test_cost_model_file_is_used_and_bad_file_named(tmp_path):
    slow = CostModel(decode_seq_s=1e-2)
    path = tmp_path / "cost.json"
    slow.save(path)
    out = _simulate_cli(tmp_path, "slow", "--cost-model", str(path), "--num-requests", "200")
    fast = _simulate_cli(tmp_path, "fast", "--num-requests", "200")
    slow_tpot = pl.read_parquet(out / "requests.parquet")["tpot_s"].median()
    fast_tpot = pl.read_parquet(fast / "requests.parquet")["tpot_s"].median()
    assert slow_tpot > 5 * fast_tpot
    (tmp_path / "bad.json").write_text('{"decode_seq_s": -1}')
    result = runner.invoke(
        app, ["simulate", "--cost-model", str(tmp_path / "bad.json"), "--out", str(tmp_path / "y")]
    )
    assert result.exit_code == 2 and "decode_seq_s" in flat(result.output)


def test_closed_loop_profile_keeps_concurrency(tmp_path):
    profile = resolve_profile("default_py_example")
    result = simulate(profile, EngineConfig(), CostModel())
    frame = result.requests
    assert frame["status"].eq("ok").all()
    closed = frame.filter(pl.col("request_id").str.contains("-c0-"))
    assert closed.height > 8
    # Never more than `concurrency` closed-loop requests in flight at once.
    concurrency = next(p.concurrency for p in profile.phases if p.concurrency)
    events = pl.concat(
        [
            closed.select(pl.col("scheduled_at").alias("t"), pl.lit(1).alias("d")),
            closed.select(pl.col("finished_at").alias("t"), pl.lit(-1).alias("d")),
        ]
    ).sort("t", "d")
    assert events["d"].cum_sum().max() <= concurrency


def test_default_profile_shows_the_policy_tradeoff():
    """Trap 3 at the level users see it: SJF and priority serve short requests
    sooner than FCFS while long requests wait longer; max_wait_s bounds that wait."""
    profile = resolve_profile("default")

    def run(**knobs):
        frame = simulate(
            profile, EngineConfig(SchedulerConfig(**knobs)), CostModel(), record_decisions=False
        ).requests
        by_class = {name: group for (name,), group in frame.group_by("class")}
        return by_class["short_chat"], by_class["long_generation"]

    fcfs_short, fcfs_long = run(scheduling_policy="fcfs")
    sjf_short, sjf_long = run(scheduling_policy="sjf")
    prio_short, prio_long = run(scheduling_policy="priority")
    bounded_short, bounded_long = run(scheduling_policy="sjf", max_wait_s=0.5)

    q = "queue_s"
    assert sjf_short["ttft_s"].quantile(0.99) < fcfs_short["ttft_s"].quantile(0.99)
    assert prio_short["ttft_s"].quantile(0.99) < fcfs_short["ttft_s"].quantile(0.99)
    assert sjf_long[q].max() > fcfs_long[q].max()
    assert prio_long[q].max() > fcfs_long[q].max()
    assert bounded_long[q].max() < sjf_long[q].max()


def test_kv_pool_pressure_preempts_and_everything_finishes():
    profile = resolve_profile("default")
    config = EngineConfig(
        SchedulerConfig(scheduling_policy="priority"),
        CacheConfig(num_gpu_blocks_override=400, num_cpu_blocks_override=100),
    )
    result = simulate(profile, config, CostModel())
    frame = result.requests
    assert frame["status"].eq("ok").all()
    assert frame["preempt_swaps"].sum() > 0
    assert frame["preempt_recomputes"].sum() > 0  # the small host pool fills up
    decisions = decisions_frame(result.decisions)
    fallback = decisions.filter(
        (pl.col("kind") == "preempt") & (pl.col("detail") == "swap_space_exhausted")
    )
    assert fallback.height > 0
    assert frame["recomputed_tokens"].sum() > 0
