"""The served path's own work, and calibrating the simulator from a run's step records.

Not timing assertions: counts. The step loop hands a step's tokens to the event loop
once per step (not once per token or per stream) and does not spin while idle; a cost
model fitted from step records recovers the model that produced them.
"""

from __future__ import annotations

import json
import threading
import time

import polars as pl
import pytest
from typer.testing import CliRunner

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import FEATURES, CostModel
from engine.serving.tokenizer import HashTokenizer
from engine.sim.cost_fit import CalibrationError, fit_from_steps
from harness.cli import app
from harness.profiles import resolve_profile
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine
from harness.simulate.driver import run_simulations, simulate

pytestmark = [pytest.mark.slow]

#: Every parameter non-zero and different, so a fit that drops or swaps one shows.
KNOWN = CostModel(
    step_overhead_s=2e-3,
    prefill_token_s=3e-5,
    decode_seq_s=2e-4,
    decode_context_token_s=5e-7,
    prefill_attention_s=4e-8,
    swap_block_s=3e-5,
    prefill_seq_s=7e-4,
    mixed_step_s=1.1e-3,
    prefill_padded_attention_s=2e-8,
    client_latency_s=0.0,
    source="synthetic",
)


def test_one_hand_off_per_step_and_no_spinning_while_idle():
    engine = sim_engine(step_s=0.002)
    with BackgroundServer(engine, HashTokenizer(4096)) as server:
        async_engine = server.async_engine
        url = server.url

        def client(i: int) -> None:
            status, _, raw = HttpClient(url).post_json(
                "/v1/completions",
                {
                    "model": "tiny",
                    "prompt": f"stream {i}",
                    "max_tokens": 20,
                    "ignore_eos": True,
                    "stream": True,
                },
            )
            assert status == 200 and raw.count(b"data: ") >= 20

        handoffs_before = async_engine.num_handoffs
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        steps = async_engine.stats.num_steps
        handoffs = async_engine.num_handoffs - handoffs_before
        # 8 streams x 20 tokens = 160 tokens; per step one hand-off, plus one per accepted
        # request (its admission), never one per token
        assert handoffs <= steps + 8, (handoffs, steps)
        assert handoffs < 160
        # idle: the loop sleeps until a command or its idle timeout (0.05 s)
        time.sleep(0.05)
        iterations = async_engine.num_loop_iterations
        started = time.monotonic()
        time.sleep(0.5)
        elapsed = time.monotonic() - started  # the sleep may oversleep on a loaded machine
        idle_iterations = async_engine.num_loop_iterations - iterations
        # one wake-up per idle timeout (twice that for slack); a spinning loop: thousands
        assert idle_iterations <= 2 * elapsed / 0.05 + 3, idle_iterations
        assert async_engine.stats.num_steps == steps  # no steps while idle


def _simulated_steps(tmp_path):
    """A simulated run (virtual clock) of the default profile under the known model, on
    a pool small enough to swap: its steps.parquet."""
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=32),
        CacheConfig(num_gpu_blocks_override=400, num_cpu_blocks_override=400),
    )
    run_simulations(
        resolve_profile("default").with_rate_scale(2.0),
        {"fcfs": config},
        KNOWN,
        tmp_path,
        num_requests=300,
    )
    return pl.read_parquet(tmp_path / "steps.parquet")


def test_fitting_step_records_recovers_the_cost_model_that_made_them(tmp_path):
    steps = _simulated_steps(tmp_path)
    assert steps["num_blocks_swapped_out"].sum() > 0  # every feature is exercised
    assert ((steps["num_prefill_tokens"] > 0) & (steps["num_decode_seqs"] > 0)).any()
    assert steps["idle_before_s"].sum() > 0  # and the run had idle gaps to leave out
    fitted = fit_from_steps(steps)
    for name in FEATURES:
        assert getattr(fitted, name) == pytest.approx(getattr(KNOWN, name), rel=1e-6), name
    assert fitted.fit["holdout_median_rel_error"] < 1e-9
    # the simulator with the fitted model reproduces the run
    profile = resolve_profile("default").with_rate_scale(2.0)
    a = simulate(profile, EngineConfig(), KNOWN, requests=None, record_decisions=False)
    b = simulate(profile, EngineConfig(), fitted, requests=None, record_decisions=False)
    assert a.requests["e2e_s"].to_list() == pytest.approx(b.requests["e2e_s"].to_list(), rel=1e-6)


def test_calibrate_from_steps_on_the_command_line(tmp_path):
    _simulated_steps(tmp_path)
    out = tmp_path / "fitted.json"
    result = CliRunner().invoke(
        app, ["calibrate", "--from-steps", str(tmp_path), "--executor", "torch", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["source"] == "steps" and data["fit"]["holdout_points"] > 0
    assert data["decode_seq_s"] == pytest.approx(KNOWN.decode_seq_s, rel=1e-6)
    bad = CliRunner().invoke(app, ["calibrate", "--from-steps", str(tmp_path / "nope.parquet")])
    assert bad.exit_code == 2 and "--from-steps" in bad.output


def test_calibrate_takes_client_latency_from_a_run_cells_client_records(tmp_path):
    """Beside a cell's steps.parquet, requests.parquet has the client's TTFT from its send
    and the engine's TTFT from its arrival stamp: their median gap (finished requests
    only) is the model's client_latency_s, which simulated client-side TTFT/E2E add."""
    from engine.sim.cost_fit import client_latency_from_requests

    _simulated_steps(tmp_path)
    gaps = [0.002, 0.003, 0.004, 0.0031, 0.0029]
    pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(7)],
            "status": ["ok"] * 5 + ["error", "ok"],
            "engine_ttft_s": [0.01] * 5 + [0.01, None],
            "ttft_from_sent_s": [0.01 + g for g in gaps] + [5.0, 0.5],
        }
    ).write_parquet(tmp_path / "requests.parquet")
    latency, rows = client_latency_from_requests([pl.read_parquet(tmp_path / "requests.parquet")])
    assert latency == pytest.approx(0.003) and rows == 5
    out = tmp_path / "fitted.json"
    result = CliRunner().invoke(
        app, ["calibrate", "--from-steps", str(tmp_path), "--executor", "torch", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["client_latency_s"] == pytest.approx(0.003)
    assert "client latency: 3.00 ms" in result.output
    # simulated records (no engine column) say nothing about the client
    assert client_latency_from_requests([pl.DataFrame({"status": ["ok"], "ttft_s": [1.0]})]) is None


def test_too_few_steps_or_missing_columns_are_named(tmp_path):
    steps = _simulated_steps(tmp_path)
    with pytest.raises(CalibrationError, match="too few"):
        fit_from_steps(steps.head(5))
    with pytest.raises(CalibrationError, match="idle_before_s"):
        fit_from_steps(steps.drop("idle_before_s"))


def test_serve_records_its_steps_at_shutdown(tmp_path):
    from harness.serve.local_server import CliServer

    path = tmp_path / "served" / "steps.parquet"
    with CliServer(["--executor", "sim", "--record-steps", str(path)]) as server:
        status, _, _ = HttpClient(server.url).post_json(
            "/v1/completions",
            {"model": "tiny", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True},
        )
        assert status == 200
        server.terminate()
        assert server.wait(30) == 0
    steps = pl.read_parquet(path)
    assert steps.height >= 5 and steps["num_decode_seqs"].sum() == 4  # 1 prefill + 4 decodes
    assert (steps["execute_end"] >= steps["execute_start"]).all()


def test_client_latency_is_added_to_client_side_times_only():
    import dataclasses

    profile = resolve_profile("default")
    instant = dataclasses.replace(CostModel(), client_latency_s=0.0)
    base = simulate(profile, EngineConfig(), instant, record_decisions=False).requests
    slow = simulate(
        profile,
        EngineConfig(),
        dataclasses.replace(instant, client_latency_s=0.01),
        record_decisions=False,
    ).requests
    for name in ("ttft_s", "ttft_from_sent_s", "e2e_s"):
        assert (slow[name] - base[name]).to_list() == pytest.approx([0.01] * base.height)
    for name in ("tpot_s", "queue_s", "finished_at"):  # the engine ran exactly the same
        assert slow[name].to_list() == base[name].to_list()
    with pytest.raises(ValueError, match="client_latency_s"):
        CostModel(client_latency_s=-1.0)


@pytest.mark.parametrize("core", ["process", "thread"])
def test_serve_records_its_requests_at_shutdown(tmp_path, core):
    from harness.serve.local_server import CliServer

    path = tmp_path / "requests.parquet"
    with CliServer(
        ["--executor", "sim", "--engine-core", core, "--record-requests", str(path)]
    ) as server:
        client = HttpClient(server.url)
        for i, cls in enumerate(["chat", "batch"]):
            status, _, _ = client.post_json(
                "/v1/completions",
                {"model": "tiny", "prompt": "a b c", "max_tokens": 3 + i, "ignore_eos": True},
                {"X-Request-Id": f"r{i}", "X-Request-Class": cls},
            )
            assert status == 200
        server.terminate()
        assert server.wait(30) == 0
    rows = pl.read_parquet(path).sort("request_id")
    assert rows["request_id"].to_list() == ["r0", "r1"]
    assert rows["class"].to_list() == ["chat", "batch"]
    assert rows["output_tokens"].to_list() == [3, 4] and set(rows["status"]) == {"ok"}
    assert (rows["first_token_at"] >= rows["scheduled_at"]).all()


def test_client_latency_leaves_out_what_a_lagging_generator_sent():
    """Requests the load generator sent late or held for its in-flight cap carry its own
    delay in reading their first token: with a lag limit they are left out, so a busy
    generator on a slow machine does not make the client latency ten times too long."""
    from engine.sim.cost_fit import client_latency_from_requests

    frame = pl.DataFrame(
        {
            "status": ["ok"] * 6,
            "engine_ttft_s": [0.01] * 6,
            # three quiet requests 3 ms outside the engine, three behind a busy generator
            "ttft_from_sent_s": [0.013, 0.013, 0.013, 0.05, 0.05, 0.05],
            "send_lag_s": [0.001, 0.002, 0.001, 0.2, 0.001, 0.3],
            "in_flight_capped": [False, False, False, False, True, False],
        }
    )
    assert client_latency_from_requests([frame])[0] == pytest.approx(0.0215)
    latency, rows = client_latency_from_requests([frame], max_send_lag_s=0.010)
    assert latency == pytest.approx(0.003) and rows == 3
