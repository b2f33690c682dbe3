"""The served calibration's schedule and its command line (no server started here:
the served run itself is tests/harness/calibration/test_served_calibration_sim.py)."""

from __future__ import annotations

import polars as pl
import pytest
from typer.testing import CliRunner

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.calibration import served as served_calibration
from harness.calibration.served import (
    DECODE_HEAVY_SEQS,
    PREFILL_BURST_TOKENS,
    SHAPE_FAMILIES,
    ServedCalibrationError,
    calibration_profile,
    calibration_schedule,
    shape_coverage,
    step_drift,
    step_noise,
)
from harness.cli import app
from harness.costmodel.fit import HOLDOUT_TARGETS, fit_summary
from harness.simulate.driver import simulate


def _simulated_steps(quick: bool):
    """The steps the schedule makes when simulated with the built-in cost model (a
    served run of this machine's engine, as the defaults describe it)."""
    specs = calibration_schedule(quick)
    result = simulate(
        calibration_profile(quick),
        EngineConfig(),
        CostModel(),
        requests=specs,
        record_decisions=False,
    )
    return specs, result.steps


@pytest.mark.parametrize("quick", [True, False])
def test_the_schedule_covers_every_shape_family(quick):
    specs, steps = _simulated_steps(quick)
    coverage = shape_coverage(steps)
    assert set(coverage) == set(SHAPE_FAMILIES)
    # every family well represented: at least 20 steps each (a handful would not pin
    # the coefficients the family exercises)
    assert all(n >= 20 for n in coverage.values()), coverage
    # and the extremes are reached: decode batches far past the family's threshold,
    # prefill steps near the token budget, contexts near max_model_len
    limit = SchedulerConfig().max_model_len
    assert steps["num_decode_seqs"].max() >= 2 * DECODE_HEAVY_SEQS
    assert steps["num_prefill_tokens"].max() >= 1.5 * PREFILL_BURST_TOKENS
    assert max(s.prompt_tokens + s.max_tokens for s in specs) >= 0.85 * limit
    # small batches too (the tail of each phase): a fit must not extrapolate down
    assert steps.filter(steps["num_seqs"] <= 4).height >= 20
    # and the mid-size decode batches a profile's runs spend most steps at (4-47
    # sequences): a fifth of the steps at least (the quick schedule gave 7.5% before
    # its ramp, and its fit priced a 1x run's steps 5-19% high)
    mid = steps.filter(
        (steps["num_prefill_tokens"] == 0)
        & (steps["num_decode_seqs"] >= 4)
        & (steps["num_decode_seqs"] < 48)
    )
    assert mid.height >= 0.2 * steps.height, (mid.height, steps.height)


def test_every_request_fits_max_model_len_and_asks_for_its_true_length():
    for limit in (512, 2048, 4096):
        for quick in (True, False):
            specs = calibration_schedule(quick, max_model_len=limit)
            assert all(s.prompt_tokens + s.max_tokens <= limit for s in specs), limit
            assert all(s.max_tokens == s.output_tokens for s in specs)
            assert {s.class_name for s in specs} == set(SHAPE_FAMILIES)


def test_the_schedule_is_one_exact_schedule_per_seed():
    def key(specs):
        return [
            (s.request_id, s.class_name, s.prompt_tokens, s.max_tokens, s.scheduled_at)
            for s in specs
        ]

    assert key(calibration_schedule(True)) == key(calibration_schedule(True))
    assert key(calibration_schedule(False, seed=3)) == key(calibration_schedule(False, seed=3))
    assert key(calibration_schedule(False, seed=3)) != key(calibration_schedule(False, seed=4))
    # quick is the shorter schedule; full has a light round of the same phases
    assert len(calibration_schedule(True)) * 2 < len(calibration_schedule(False))
    quick, full = calibration_profile(True).phases, calibration_profile(False).phases
    assert [p.name for p in quick][1:] == [p.name for p in full][:5]
    assert [p.name for p in full][5:] == [f"{p.name}_light" for p in full][:5]
    assert quick[0].name == "small_batches" and len(full) == 10


def test_shape_coverage_counts_each_family():
    import polars as pl

    steps = pl.DataFrame(
        {
            "num_prefill_tokens": [0, 2000, 100, 0, 0],
            "num_decode_seqs": [40, 0, 3, 2, 1],
            "num_decode_context_tokens": [4000, 0, 300, 3000, 10],
        }
    )
    assert shape_coverage(steps, max_model_len=2048) == {
        "decode_heavy": 1,
        "prefill_burst": 1,
        "mixed": 1,
        "long_context": 1,
    }


def _invoke(*args: str):
    result = CliRunner().invoke(app, ["calibrate", *args])
    return result.exit_code, " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("args", "flag", "words"),
    [
        (["--method", "offline"], "--method", "unknown method 'offline'"),
        (["--method", "served", "--from-steps", "x.parquet"], "--method", "takes no --method"),
        (["--executor", "gpu"], "--executor", "unknown executor 'gpu'"),
        (["--method", "profile", "--executor", "sim"], "--executor", "only to --method served"),
        (["--method", "profile", "--records-dir", "d"], "--records-dir", "does not apply"),
        (["--from-steps", "x.parquet", "--seed", "1"], "--seed", "does not apply to --from-steps"),
        (["--device", "cpu"], "--device", "only to --method profile"),
        (["--repeats", "3"], "--repeats", "does not apply to --method served (the default)"),
        (["--executor", "sim", "--cost-model", "/nonexistent.json"], "--cost-model", ""),
        (["--model", "no-such-preset"], "--model", ""),
        (["--seed", "-1"], "--seed", ""),
        (["--block-size", "7"], "--block-size", "power of two"),
        # the served engine's knobs: checked as serve checks them, before anything starts
        (["--max-num-seqs", "0"], "--max-num-seqs", "max_num_seqs must be >= 1"),
        (["--swap-space", "-1"], "--swap-space", "swap_space must be >= 0"),
        (["--max-model-len", "128"], "--max-model-len", "too short to calibrate with"),
        (["--torch-threads", "-1"], "--torch-threads", "must be >= 0"),
        (["--method", "profile", "--max-num-seqs", "8"], "--max-num-seqs", "does not apply"),
        (["--from-steps", "x.parquet", "--swap-space", "1"], "--swap-space", "--from-steps"),
        (
            ["--method", "profile", "--torch-threads", "1"],
            "--torch-threads",
            "only to --method served or --from-steps",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args, flag, words, tmp_path):
    code, text = _invoke(*args, "--out", str(tmp_path / "out.json"))
    assert code == 2, text
    assert flag in text and words in text, text
    assert not (tmp_path / "out.json").exists()


def test_a_cost_model_that_is_not_one_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"step_overhead_s": -1}')
    code, text = _invoke("--executor", "sim", "--cost-model", str(bad))
    assert code == 2 and "--cost-model" in text and "step_overhead_s" in text, text


def test_step_noise_compares_consecutive_decode_steps_of_one_batch_size():
    import polars as pl

    # cycles (start to start): 0.10, 0.11, 0.10, 0.10 (decode, batch 8), then 0.30 (a
    # prefill step: never compared)
    steps = pl.DataFrame(
        {
            "step": [1, 2, 3, 4, 5, 6],
            "schedule_start": [0.0, 0.10, 0.21, 0.31, 0.41, 0.71],
            "idle_before_s": [0.0] * 6,
            "num_seqs": [8, 8, 8, 8, 8, 8],
            "num_prefill_tokens": [0, 0, 0, 0, 100, 0],
        }
    )
    # pairs: 0.11/0.10 -> 10%, 0.10/0.11 -> 9.1%, 0.10/0.10 -> 0: median 9.1%
    assert step_noise(steps) == pytest.approx(1 - 0.10 / 0.11, abs=1e-6)
    assert step_noise(steps.with_columns(num_seqs=pl.Series([1, 2, 3, 4, 5, 6]))) is None


def test_step_drift_compares_one_decode_work_seconds_apart_not_consecutive_steps():
    """Batch 4 at one context: 0.10 s cycles, then, three seconds later, 0.12 s ones (a
    machine that slowed down). Consecutive steps agree but at the change (noise 0),
    while the same work seconds apart differs by 1 - 0.10/0.12. A batch-8 step is
    never compared with batch 4."""
    import polars as pl

    starts = [0.0, 0.1, 0.2, 3.0, 3.12, 3.24, 3.5]
    steps = pl.DataFrame(
        {
            "step": list(range(1, 8)),
            "schedule_start": starts,
            # the gap before the fourth step is idle: step 3's cycle is 0.10 too
            "idle_before_s": [0.0, 0.0, 0.0, 2.7, 0.0, 0.0, 0.0],
            "num_seqs": [4, 4, 4, 4, 4, 8, 4],
            "num_prefill_tokens": [0] * 7,
            "num_decode_context_tokens": [400, 400, 400, 400, 400, 800, 400],
        }
    )
    assert step_noise(steps) == pytest.approx(0.0, abs=1e-9)
    assert step_drift(steps) == pytest.approx(1 - 0.10 / 0.12, abs=1e-6)
    squeezed = steps.with_columns(
        schedule_start=pl.Series([t / 100 for t in starts]),
        idle_before_s=pl.Series([0.0, 0.0, 0.0, 0.027, 0.0, 0.0, 0.0]),
    )
    assert step_drift(squeezed) is None  # nothing 2 s apart


@pytest.mark.slow
def test_a_server_that_refuses_to_start_fails_the_calibration_with_its_words(tmp_path):
    """The server, not calibrate, refuses a records directory holding a crashed run's
    unrecovered parts: calibrate ends with exit 1 and the server's own message (its log
    quoted as text), writes no cost model, and leaves no server behind."""
    from harness.records.incremental import parts_dir

    records = tmp_path / "records"
    parts_dir(records / "requests.parquet").mkdir(parents=True)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        app,
        ["calibrate", "--executor", "sim", "--records-dir", str(records), "--out", str(out)],
    )
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "calibration failed" in text and "exited with 2" in text, text
    assert "recover-records" in text, text
    assert not out.exists()


def test_the_held_out_error_is_judged_against_the_target_of_the_way_it_was_fitted():
    fitted = CostModel(
        fit={
            "holdout_median_rel_error": 0.069,
            "holdout_p90_rel_error": 0.2,
            "holdout_points": 9,
            "holdout_total_time_ratio": 0.992,
        }
    )
    full = fit_summary(fitted, True, HOLDOUT_TARGETS["served"])
    quick = fit_summary(fitted, True, HOLDOUT_TARGETS["served quick"])
    assert "6.9%" in full and "target <= 5%" in full and full.endswith("NOT met"), full
    assert "their total time priced 0.8% low;" in full, full
    assert "target <= 10%" in quick and quick.endswith(": met"), quick
    assert "target" not in fit_summary(fitted, True, None)


def test_a_request_of_the_schedule_not_served_fails_the_calibration_naming_it():
    class Server:
        def log_tail(self):
            return "the server's last words"

    client = pl.DataFrame(
        {
            "request_id": ["r0", "r1", "r2"],
            "status": ["ok", "http_error", "http_error"],
            "prompt_tokens": [10, 2000, 30],
            "max_tokens": [5, 8, 9],
            "error": [None, "400: prompt too long", "400: no"],
        }
    )
    with pytest.raises(ServedCalibrationError) as caught:
        served_calibration._check_all_served(client, Server())
    text = str(caught.value)
    assert "2 of 3 requests" in text and "http_error 2" in text, text
    assert "r1 (2000 prompt tokens" in text and "prompt too long" in text, text
    assert "the server's last words" in text
    served_calibration._check_all_served(client.head(1), Server())  # all ok: nothing
