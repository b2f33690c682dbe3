"""``--rate-scale auto[:F]`` against a target, from the command line as a user runs it:
``schedscope run --target URL`` and ``locust -f PROFILE --host URL``, each a subprocess,
against a ``schedscope serve --executor sim`` this module starts, whose capacity is
known: every step sleeps a constant ``STEP_S``, ``MAX_NUM_SEQS`` sequences at a time, so
it completes ``MAX_NUM_SEQS / (mean output tokens x STEP_S)`` requests per second.

The saturation probe is not shortened (neither command has an option for it): 10 s to
fill the batch and 20 s measured, so each of the first two tests takes about 45 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from harness.loadgen.merge import merge_records
from harness.profiles import Profile, build_plan, load_profile
from harness.profiles.rate_scale import ChosenScale, offered_rate
from harness.serve.local_server import CliServer
from tests.support.cost_model_file import constant_cost_model_file
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.run_cli import schedscope_run
from tests.support.vllm_stub import VllmStub

pytestmark = [pytest.mark.slow]

STEP_S = 0.05
MAX_NUM_SEQS = 16
FRACTION = 0.5
DURATION_SCALE = 0.25
SEED = 7

#: One class of 8-token prompts and 10-30 output tokens (mean 20); 10 s at 2 req/s then
#: 10 s at 6 req/s: a mean offered load of 4 req/s at 1x. Cut to 5 s by DURATION_SCALE.
PROFILE_TOML = f"""
name = "known_mix"
seed = {SEED}

[[classes]]
name = "only"
max_tokens = 40
prompt_tokens = {{ kind = "fixed", value = 8 }}
output_tokens = {{ kind = "uniform", low = 10, high = 30 }}

[[phases]]
name = "low"
duration_s = 10
rate = 2.0

[[phases]]
name = "high"
duration_s = 10
rate = 6.0
"""
MEAN_OUTPUT_TOKENS = 20
#: requests per second the served engine completes when it always has work (16)
KNOWN_CAPACITY = MAX_NUM_SEQS / (MEAN_OUTPUT_TOKENS * STEP_S)
#: the probe against the known capacity: the served steps take a little more than the
#: sleep, and a busy 2-core machine slows the server's loop
CAPACITY_TOLERANCE = 0.2

ANNOUNCED = (
    "rate scale auto: probing the target's capacity (64 concurrent streams of known_mix's "
    "mix, 10 s to fill + 20 s measured, then at most 60 s for what is in flight)"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    cost = constant_cost_model_file(tmp_path_factory.mktemp("cost"), STEP_S)
    args = ["--executor", "sim", "--cost-model", cost, "--max-num-seqs", str(MAX_NUM_SEQS)]
    with CliServer(args) as live:
        yield live


def _profile_file(directory: Path) -> Path:
    path = directory / "known_mix.toml"
    path.write_text(PROFILE_TOML)
    return path


def _scheduled(profile: Profile, factor: float) -> list[tuple[str, float]]:
    """The open-loop (request id, schedule offset) pairs the profile sends at ``factor``,
    shortened as the tests shorten it, with its own seed."""
    plan = build_plan(profile.with_rate_scale(factor).with_duration_scale(DURATION_SCALE))
    pairs = []
    for spec in plan.open_loop_requests():
        assert spec.scheduled_at is not None, spec
        pairs.append((spec.request_id, spec.scheduled_at))
    return pairs


def _sent(frame: pl.DataFrame) -> list[tuple[str, float]]:
    rows = frame.filter(pl.col("phase_kind") == "open").sort("schedule_offset_s")
    return list(zip(rows["request_id"], rows["schedule_offset_s"], strict=True))


def test_run_against_a_target_scales_to_the_probed_capacity(server, tmp_path):
    profile_path = _profile_file(tmp_path)
    profile = load_profile(profile_path)
    out = tmp_path / "run"
    proc = schedscope_run(
        [
            "--target", server.url, "--profile", str(profile_path),
            "--rate-scale", f"auto:{FRACTION}", "--policy", "fcfs",
            "--duration-scale", str(DURATION_SCALE), "--prompt-mode", "token_ids",
            "--no-report", "--out", str(out),
        ],
        tmp_path / "store",
        timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    chosen = ChosenScale.from_dict(info["rate_scale_auto"])
    assert chosen is not None, info["rate_scale_auto"]
    assert chosen.method == "probe" and chosen.fraction == FRACTION
    assert "64 concurrent streams of its mix" in chosen.how
    assert chosen.capacity_rps == pytest.approx(KNOWN_CAPACITY, rel=CAPACITY_TOLERANCE)
    assert chosen.offered_rps == offered_rate(profile) == pytest.approx(4.0)
    assert chosen.factor == pytest.approx(FRACTION * chosen.capacity_rps / chosen.offered_rps)
    # far enough from 1 that a schedule left at its own rates is told apart
    assert chosen.factor > 1.5

    # announced before the probe, and the choice printed as docs/profiles.md shows it
    lines = proc.stderr.splitlines()
    assert ANNOUNCED in lines
    assert chosen.line("known_mix") in lines
    line = chosen.line("known_mix")
    assert line.startswith(f"rate scale: auto:{FRACTION:g} -> {chosen.factor:.3g}x: known_mix's ")
    assert "this engine's capacity on its mix" in line and "(probe: " in line
    assert line.endswith("= 50% of it")

    # the one cell ran at the chosen factor: its schedule is the profile's at that factor
    assert [c["rate_scale"] for c in info["cells"]] == [chosen.factor]
    cell = out / "target"
    cell_info = json.loads((cell / "run.json").read_text())
    assert cell_info["rate_scale"] == chosen.factor
    scheduled = _scheduled(profile, chosen.factor)
    assert cell_info["scheduled_requests"] == len(scheduled)
    assert len(scheduled) > 1.4 * len(_scheduled(profile, 1.0))
    frame = pl.read_parquet(cell / "requests.parquet")
    assert [r for r, _ in _sent(frame)] == [r for r, _ in scheduled]
    assert [t for _, t in _sent(frame)] == pytest.approx([t for _, t in scheduled])
    assert (frame["status"] == "ok").all(), frame["error"].unique().to_list()


def test_locust_with_a_profile_scales_to_the_probed_capacity(server, tmp_path):
    profile_path = _profile_file(tmp_path)
    profile = load_profile(profile_path)
    # a TOML profile as a locustfile: what `schedscope run` writes for one
    locustfile = tmp_path / "known_mix_locust.py"
    locustfile.write_text(
        "from harness.loadgen.expose import expose\n"
        "from harness.profiles import load_profile\n\n"
        f"PROFILE = load_profile({str(profile_path)!r})\n"
        "expose(PROFILE, globals())\n"
    )
    records = tmp_path / "records"
    proc = subprocess.run(
        [
            sys.executable, "-m", "locust", "-f", str(locustfile), "--host", server.url,
            "--headless", "--only-summary", "--rate-scale", f"auto:{FRACTION}",
            "--duration-scale", str(DURATION_SCALE), "--prompt-mode", "token_ids",
            "--records-dir", str(records), "--grace", "20",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("schedscope: rate scale")]
    assert len(said) == 1, proc.stderr[-3000:]
    pattern = (
        rf"schedscope: rate scale: auto:{FRACTION:g} -> (?P<factor>[0-9.]+)x: known_mix's mean "
        r"offered load 4 req/s at 1x, this engine's capacity on its mix "
        r"(?P<capacity>[0-9.]+) req/s \(probe: 64 concurrent streams of its mix .*\), so "
        r"(?P<load>[0-9.]+) req/s = 50% of it"
    )
    match = re.fullmatch(pattern, said[0])
    assert match, said[0]

    # the factor every process used, exactly (each process's summary has its options)
    (summary_file,) = records.glob("summary-*.json")
    summary = json.loads(summary_file.read_text())
    factor = summary["options"]["rate_scale"]
    assert match["factor"] == f"{factor:.3g}"
    capacity, load = float(match["capacity"]), float(match["load"])
    assert capacity == pytest.approx(KNOWN_CAPACITY, rel=CAPACITY_TOLERANCE)
    # the printed figures have 3 significant digits
    assert factor == pytest.approx(FRACTION * capacity / offered_rate(profile), rel=0.01)
    assert load == pytest.approx(factor * offered_rate(profile), rel=0.01)
    assert factor > 1.5

    # the records: the profile's schedule at that factor, every request answered
    merged = merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    scheduled = _scheduled(profile, factor)
    assert len(scheduled) > 1.4 * len(_scheduled(profile, 1.0))
    assert [r for r, _ in _sent(frame)] == [r for r, _ in scheduled]
    assert [t for _, t in _sent(frame)] == pytest.approx([t for _, t in scheduled])
    assert merged["status_counts"] == {"ok": len(scheduled)}


def _usage_error(stderr: str) -> str:
    """Typer's error panel as one line: its box drawn away, its wrapping undone."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", stderr).split())


def test_a_target_that_does_not_answer_is_a_usage_error_naming_why(tmp_path):
    """Nothing listens on the port: the probe stops the run at once (exit 2, a usage
    error, docs/run.md), saying the target did not answer, and nothing is written. It
    said the model could not be read and to pass --model, the engine's preset in `run`."""
    profile_path = _profile_file(tmp_path)
    out = tmp_path / "run"
    port = free_port()
    proc = schedscope_run(
        [
            "--target", f"http://127.0.0.1:{port}", "--profile", str(profile_path),
            "--rate-scale", "auto", "--policy", "fcfs", "--prompt-mode", "token_ids",
            "--duration-scale", str(DURATION_SCALE), "--no-report", "--out", str(out),
        ],
        tmp_path / "store",
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = _usage_error(proc.stderr)
    assert "Invalid value for --rate-scale: auto: the target's probe: " in said, said
    assert "the server did not answer GET /v1/models" in said, said
    assert f"port={port}" in said and "Connection refused" in said, said
    assert "cannot read the model" not in said and "--model" not in said, said
    assert "rate scale: auto" not in proc.stderr.replace("rate scale auto: probing", "")
    assert not out.exists()


def test_a_target_that_names_no_model_is_told_to_pass_target_model(tmp_path):
    """A target whose /v1/models names no model: `run`'s option for the name is
    --target-model (its --model is the bundled engine's preset)."""
    profile_path = _profile_file(tmp_path)
    out = tmp_path / "run"
    with VllmStub(vocab_size=50000, model="") as stub:
        proc = schedscope_run(
            [
                "--target", stub.url, "--profile", str(profile_path),
                "--rate-scale", "auto", "--prompt-mode", "token_ids", "--out", str(out),
            ],
            tmp_path / "store",
            timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = _usage_error(proc.stderr)
    assert "auto: the target's probe: cannot read the model" in said, said
    assert said.count("pass --target-model") == 1 and "pass --model" not in said, said
    assert not out.exists()
