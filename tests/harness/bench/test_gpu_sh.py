"""benchmarks/gpu.sh on a machine without CUDA, in its smallest mode: no install, no
calibration, one cheap benchmark. It must skip the CUDA-only step saying why, run the
rest on the CPU and leave every file it promises in its folder."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

from tests.support.paths import REPO


def test_gpu_sh_without_cuda_skips_the_cuda_steps_and_fills_its_folder(tmp_path):
    out = tmp_path / "gpu"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",  # a GPU machine too takes the CPU path here
        "SCHEDSCOPE_GPU_BUDGET_S": "120",
        "SCHEDSCOPE_GPU_BENCHMARKS": "profiles",
        "SCHEDSCOPE_GPU_SKIP": "calibrate",
        "SCHEDSCOPE_COST_MODEL_DIR": str(tmp_path / "store"),
    }
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with (out / "steps.tsv").open() as f:
        steps = {row["step"]: row["status"] for row in csv.DictReader(f, delimiter="\t")}
    assert steps == {
        "install": "skipped",
        "machine": "ok",
        "cuda": "no CUDA",
        "tests-cuda": "skipped",
        "calibrate": "skipped",
        "benchmarks": "ok",
    }
    summary = (out / "summary.txt").read_text()
    assert "no CUDA device (torch.cuda.is_available() is False): skipping" in summary
    assert "tests-cuda: skipped: no CUDA device" in summary
    assert "calibrate: skipped: SCHEDSCOPE_GPU_SKIP" in summary
    assert "every step that ran succeeded" in summary
    assert "sample_requests per 100,000 requests" in summary  # the table, at the end
    results = json.loads((out / "benchmarks.json").read_text())
    assert results["device"] == "cpu" and results["quick"] is True
    assert [b["name"] for b in results["benchmarks"]] == ["profiles"]
    assert "this machine: " in (out / "machine.log").read_text()  # the fingerprint
    for name in ("machine.log", "cuda.log", "benchmarks.log"):
        assert (out / name).is_file(), name


def test_gpu_sh_reports_a_failed_step_and_exits_1(tmp_path):
    out = tmp_path / "gpu"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",
        "SCHEDSCOPE_GPU_BENCHMARKS": "nosuch",  # python -m benchmarks exits 2
        "SCHEDSCOPE_GPU_SKIP": "calibrate machine",
    }
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    summary = (out / "summary.txt").read_text()
    assert "benchmarks: failed (exit 2)" in summary and "nosuch" in summary
