"""``schedscope calibrate --from-run``: a cost model of an external engine from the records
of ``run --target`` cells (written by hand from a known engine: tests/support/
target_runs.py), its fingerprint, its store entry, ``simulate --cost-model target:NAME``,
and the runs it refuses."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.core.cost_model import CostModel
from harness.calibration.from_run import FromRunError, calibrate_from_runs
from harness.cli.app import app
from harness.costmodel import store as cost_store
from tests.support.paths import DATA
from tests.support.target_runs import CACHE_LABELS, VLLM_INFO, write_cell

pytestmark = [pytest.mark.usefixtures("own_store")]

TRUTH = CostModel.from_coefficients(
    [8e-3, 2e-5, 5e-4, 1e-6, 0.0, 0.0, 1e-3, 0.0, 0.0, 0.0], client_latency_s=0.0
)


def test_the_fit_recovers_the_engine_its_network_and_its_identity(tmp_path):
    cell = write_cell(tmp_path / "run" / "target", TRUTH, network_s=0.003)
    fit = calibrate_from_runs([tmp_path / "run"])
    for name in ("step_overhead_s", "prefill_token_s", "decode_seq_s", "decode_context_token_s"):
        assert getattr(fit.model, name) == pytest.approx(getattr(TRUTH, name), rel=0.05), name
    assert fit.model.client_latency_s == pytest.approx(0.003, abs=2e-4)
    stats = fit.model.fit
    assert stats["holdout_median_rel_error"] < 0.05
    assert stats["streamed_requests"] == stats["requests"] == 300
    assert stats["steps_read_late"] == stats["coalesced_chunks"] == 0
    assert stats["steps_measured"] + stats["steps_not_bounded"] == stats["steps_seen"]
    assert 0 < stats["holdout_points"] < stats["train_points"]
    target = fit.fingerprint
    assert (target.engine, target.version, target.served_model) == ("vllm", "0.32.0", "tiny")
    assert (target.block_size, target.kv_blocks) == (16, 4096)
    assert target.load_machine == "Test CPU, 2 cores"
    assert target.name == "vllm-0.32.0-tiny"
    # vLLM V1's semantics, its batch defaults assumed and said so, its cache as read
    sim = fit.identity.simulate
    assert sim["preemption_mode"] == "recompute" and sim["swap_space"] == 0.0
    assert sim["enable_chunked_prefill"] and sim["enable_prefix_caching"]
    assert sim["num_gpu_blocks_override"] == 4096 and sim["max_model_len"] == 2048
    assert sorted(fit.identity.assumed) == ["max_num_batched_tokens", "max_num_seqs"]
    assert any("assumed" in line for line in fit.lines)
    assert cell.name == "target"


def test_knobs_given_at_the_run_and_at_calibrate_are_the_targets_and_key_it(tmp_path):
    write_cell(tmp_path / "a" / "target", TRUTH, target_knobs="--max-num-seqs 64")
    plain = calibrate_from_runs([tmp_path / "a"])
    assert plain.identity.simulate["max_num_seqs"] == 64
    assert plain.identity.assumed == ["max_num_batched_tokens"]
    more = calibrate_from_runs(
        [tmp_path / "a"], "--max-num-batched-tokens=4096 --scheduling-policy priority"
    )
    assert more.identity.simulate["max_num_batched_tokens"] == 4096
    assert more.identity.assumed == []
    assert more.fingerprint.key != plain.fingerprint.key
    # the policy orders the same steps: not part of the identity
    assert "--scheduling-policy" not in more.fingerprint.knob_dict()


def test_runs_of_two_targets_are_fitted_apart(tmp_path):
    write_cell(tmp_path / "a" / "target", TRUTH)
    write_cell(tmp_path / "b" / "target", TRUTH, target_knobs="--max-num-seqs 32")
    with pytest.raises(FromRunError, match="another target.*--max-num-seqs"):
        calibrate_from_runs([tmp_path / "a", tmp_path / "b"])


def test_a_target_that_changed_mid_run_is_refused(tmp_path):
    restarted = {**CACHE_LABELS, "num_gpu_blocks": "1024"}
    write_cell(tmp_path / "a" / "target", TRUTH, cache_labels=[CACHE_LABELS, restarted])
    with pytest.raises(FromRunError, match="changed during the run.*num_gpu_blocks 4096 -> 1024"):
        calibrate_from_runs([tmp_path / "a"])
    write_cell(tmp_path / "b" / "target", TRUTH, info_after={**VLLM_INFO, "version": "0.34.0"})
    with pytest.raises(FromRunError, match="changed during the run.*version 0.32.0 -> 0.34.0"):
        calibrate_from_runs([tmp_path / "b"])


def test_a_run_of_errors_only_is_refused(tmp_path):
    write_cell(tmp_path / "a" / "target", TRUTH, status="error")
    with pytest.raises(FromRunError, match="no request finished ok .*300 error.*HTTP 500"):
        calibrate_from_runs([tmp_path / "a"])


def test_a_run_without_streams_is_refused(tmp_path):
    import polars as pl

    cell = write_cell(tmp_path / "a" / "target", TRUTH)
    frame = pl.read_parquet(cell / "requests.parquet")
    frame.with_columns(pl.lit([], dtype=pl.List(pl.Float64)).alias("itl_s")).write_parquet(
        cell / "requests.parquet"
    )
    with pytest.raises(FromRunError, match="no request received a second token"):
        calibrate_from_runs([tmp_path / "a"])


def test_a_served_cell_or_an_empty_directory_is_not_a_target_run(tmp_path):
    served = tmp_path / "served" / "fcfs"
    served.mkdir(parents=True)
    (served / "run.json").write_text(json.dumps({"cell": "fcfs", "target": None}))
    with pytest.raises(FromRunError, match="not a run against a --target.*--from-steps"):
        calibrate_from_runs([served])
    with pytest.raises(FromRunError, match="no cell of a `schedscope run --target` run"):
        calibrate_from_runs([tmp_path / "served"])
    with pytest.raises(FromRunError, match="no such run directory"):
        calibrate_from_runs([tmp_path / "nowhere"])


def test_the_command_stores_the_fit_shows_it_and_simulate_uses_its_engine(tmp_path, own_store):
    write_cell(tmp_path / "run" / "target", TRUTH, target_knobs="--max-num-seqs 48")
    runner = CliRunner()
    done = runner.invoke(app, ["calibrate", "--from-run", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output
    assert "held-out median relative error" in done.output
    assert "in-sample median relative error" in done.output
    assert "300 of 300 requests streamed tokens" in done.output
    (entry,) = cost_store.target_entries()
    assert entry.target is not None and entry.target.name == "vllm-0.32.0-tiny"
    assert entry.path.name == f"cost-model-target-{entry.target.key}.json"
    assert cost_store.find(_any_machine()).match is None  # never this machine's fit
    shown = runner.invoke(app, ["calibrate", "--show"])
    assert "TARGET vllm 0.32.0 serving tiny" in shown.output, shown.output

    out = tmp_path / "sim"
    simulated = runner.invoke(
        app,
        [
            "simulate",
            "--cost-model",
            "target:vllm-0.32.0-tiny",
            "--max-num-batched-tokens",
            "1024",
            "--duration-scale",
            "0.05",
            "--out",
            str(out),
            "--no-speed-band",
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    summary = json.loads((out / "summary.json").read_text())
    config = summary["policies"]["fcfs"]["config"]
    assert config["scheduler"]["preemption_mode"] == "recompute"
    assert config["scheduler"]["max_num_seqs"] == 48  # the target's
    assert config["scheduler"]["max_num_batched_tokens"] == 1024  # given: the user's
    assert config["cache"]["num_gpu_blocks_override"] == 4096
    assert summary["cost_model"]["step_overhead_s"] == pytest.approx(entry.model.step_overhead_s)


def test_tune_searches_the_targets_engine_with_its_fit(tmp_path, own_store):
    """tune --cost-model target:NAME: the target's knobs are the current configuration
    where none is given, and its fit prices the search."""
    write_cell(tmp_path / "run" / "target", TRUTH, target_knobs="--max-num-seqs 48")
    runner = CliRunner()
    assert runner.invoke(app, ["calibrate", "--from-run", str(tmp_path / "run")]).exit_code == 0
    space = tmp_path / "space.toml"
    space.write_text('base = "empty"\n[params.max_num_seqs]\nchoices = [16, 48]\n')
    args = ["tune", "--cost-model", "target:vllm-0.32.0-tiny", "--space", str(space)]
    args += ["--profile", str(DATA / "tune_starvation.toml"), "--duration-scale", "0.25"]
    args += ["--max-num-batched-tokens", "1024", "--trials", "2", "--workers", "1"]
    args += ["--confirm", "0", "--out", str(tmp_path / "tune")]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "the fit of vllm 0.32.0 serving tiny" in done.output
    tune = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert tune["current"]["knobs"] == {"max_num_seqs": 48}  # the target's, searched
    # the rest of the target's engine rides in every configuration: the winner's command
    (serve,) = [line for line in done.output.splitlines() if line.startswith("schedscope: ")]
    assert "--preemption-mode recompute" in serve and "--num-gpu-blocks-override 4096" in serve
    assert "--max-num-batched-tokens 1024" in serve  # given: the user's
    (entry,) = cost_store.target_entries()
    assert tune["cost_model"] == str(entry.path)


def test_an_unknown_target_names_the_stored_ones(tmp_path):
    write_cell(tmp_path / "run" / "target", TRUTH)
    runner = CliRunner()
    assert runner.invoke(app, ["calibrate", "--from-run", str(tmp_path / "run")]).exit_code == 0
    done = runner.invoke(
        app, ["simulate", "--cost-model", "target:sglang", "--duration-scale", "0.05"]
    )
    assert done.exit_code == 2
    assert "no stored fit of target 'sglang'" in done.output
    assert "vllm-0.32.0-tiny" in done.output


def test_target_knobs_without_from_run_is_a_usage_error():
    done = CliRunner().invoke(app, ["calibrate", "--target-knobs", "--max-num-seqs 8"])
    assert done.exit_code == 2
    assert "only with --from-run" in done.output


def _any_machine():
    from harness.costmodel.machine import fingerprint

    return fingerprint("tiny")
