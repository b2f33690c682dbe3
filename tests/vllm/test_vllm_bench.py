"""benchmarks/bench_vllm.py in a very short mode (about 2-3 minutes on 2 cores, a vLLM
start included): it starts and stops both servers itself, both engines serve the same
schedule, every request is answered, vLLM's spans join every request, the bundled engine
records its steps, and the side-by-side table has both columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_benchmark_serves_one_schedule_on_both_engines(vllm_python_path, tmp_path):
    out = tmp_path / "bench"
    figures_file = tmp_path / "figures.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_vllm.py"),
            "--quick",
            "--duration-scale",
            "0.02",
            "--out",
            str(out),
            "--json",
            str(figures_file),
        ],
        cwd=REPO,
        env={**os.environ, "SCHEDSCOPE_VLLM_PYTHON": str(vllm_python_path)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    frames = {
        engine: pl.read_parquet(out / engine / engine / "requests.parquet").sort("request_id")
        for engine in ("vllm", "bundled")
    }
    schedule = ["request_id", "class", "prompt_tokens", "max_tokens", "schedule_offset_s"]
    assert frames["vllm"].height > 0
    assert frames["vllm"].select(schedule).equals(frames["bundled"].select(schedule))
    for frame in frames.values():
        assert set(frame["status"]) == {"ok"}
    vllm_cell = json.loads((out / "vllm" / "vllm" / "run.json").read_text())
    assert vllm_cell["server_columns_source"]["requests_joined"] == frames["vllm"].height
    steps = pl.read_parquet(out / "bundled-steps.parquet")
    assert steps.height > 0

    table = (out / "side_by_side.md").read_text()
    assert table.startswith("| figure | vLLM | bundled | bundled / vLLM |")
    assert "| errors | 0 | 0 |" in table
    assert table.strip().splitlines()[-1].startswith("cells: vLLM ")
    figures = {f["name"]: f["value"] for f in json.loads(figures_file.read_text())["figures"]}
    assert figures["vLLM output tokens/s"] > 0 and figures["bundled output tokens/s"] > 0
    # each server's log kept beside the runs
    assert (out / "vllm-server.log").stat().st_size > 0
    assert (out / "bundled-server.log").stat().st_size > 0
