"""benchmarks/gpu.sh on a machine without CUDA, in its smallest mode: no install, no
calibration, one cheap benchmark. It must skip the CUDA-only step saying why, drop a
benchmark name it does not know, run the rest on the CPU and bring back at most 8 files
(the logs packed in logs.tar.gz). The offline install from the bundle and the calibration
are rehearsed by `make gpu-rehearsal` (benchmarks/gpu-rehearsal.sh), in a Python 3.12
like the GPU machine's."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import tarfile

from tests.support.paths import REPO

RESULT_FILES = {
    "summary.txt",
    "steps.tsv",
    "calibrate.txt",
    "benchmarks.json",
    "pytest-cuda.xml",
    "nvidia-smi.txt",
    "logs.tar.gz",
}


def run_gpu_sh(tmp_path, **settings: str) -> tuple[subprocess.CompletedProcess, object]:
    out = tmp_path / "gpu"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",  # a GPU machine too takes the CPU path here
        "SCHEDSCOPE_COST_MODEL_DIR": str(tmp_path / "store"),
        "TMPDIR": str(tmp_path),
        **settings,
    }
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    return done, out


def steps_of(out) -> dict[str, str]:
    with (out / "steps.tsv").open() as f:
        return {row["step"]: row["status"] for row in csv.DictReader(f, delimiter="\t")}


def assert_at_most_8_files(out) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    assert {p.name for p in files} <= RESULT_FILES, files
    assert all(p.parent == out for p in files), files


def test_gpu_sh_without_cuda_skips_the_cuda_steps_and_brings_back_8_files_at_most(tmp_path):
    bundle = tmp_path / "bundle"  # wheels for another Python: this one is used as it is
    bundle.mkdir()
    (bundle / "python-version").write_text("0.0\n")
    (bundle / "nothing-1.0-py3-none-any.whl").write_bytes(b"")
    done, out = run_gpu_sh(
        tmp_path,
        SCHEDSCOPE_GPU_BUNDLE=str(bundle),
        SCHEDSCOPE_GPU_BUDGET_S="120",
        SCHEDSCOPE_GPU_BENCHMARKS="profiles nosuch",
        SCHEDSCOPE_GPU_SKIP="calibrate",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_of(out) == {
        "install": "skipped",
        "machine": "ok",
        "cuda": "no CUDA",
        "tests-cuda": "skipped",
        "calibrate": "skipped",
        "benchmarks": "ok",
        "prefix-cache": "ok",
    }
    summary = (out / "summary.txt").read_text()
    assert "holds wheels for Python 0.0, PYTHON=" in summary
    assert "no CUDA device (torch.cuda.is_available() is False): skipping" in summary
    assert "tests-cuda: skipped: no CUDA device" in summary
    assert "calibrate: skipped: SCHEDSCOPE_GPU_SKIP" in summary
    assert "dropped 'nosuch': python -m benchmarks --list does not list it" in summary
    assert "every step that ran succeeded" in summary
    assert "sample_requests per 100,000 requests" in summary  # the table
    results = json.loads((out / "benchmarks.json").read_text())
    assert results["device"] == "cpu" and results["quick"] is True
    assert [b["name"] for b in results["benchmarks"]] == ["profiles"]
    assert_at_most_8_files(out)
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
        assert {"logs/machine.log", "logs/cuda.log", "logs/benchmarks.log"} <= names, names
        machine = tar.extractfile("logs/machine.log").read().decode()
    assert "this machine: " in machine  # the fingerprint
    # the scratch folder (logs, install, records) is gone
    assert not list(tmp_path.glob("schedscope-gpu.*"))


def test_gpu_sh_runs_the_torch_model_tests_and_reads_their_junit_file(tmp_path):
    done, out = run_gpu_sh(
        tmp_path,
        SCHEDSCOPE_GPU_BUNDLE=str(tmp_path / "none"),
        SCHEDSCOPE_GPU_TESTS_ON_CPU="1",
        SCHEDSCOPE_GPU_TESTS="tests/engine/worker/test_swap_copies.py",
        SCHEDSCOPE_GPU_BENCHMARKS="",
        SCHEDSCOPE_GPU_SKIP="machine calibrate",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_of(out)["tests-cuda"] == "ok"
    summary = (out / "summary.txt").read_text()
    assert "install: skipped: no wheels in" in summary
    assert "on the cpu instead (SCHEDSCOPE_GPU_TESTS_ON_CPU=1)" in summary
    assert re.search(r"tests-cuda: [1-9]\d* passed, 0 failed, 0 errors, 0 skipped", summary)
    assert "benchmarks: skipped: SCHEDSCOPE_GPU_BENCHMARKS is empty" in summary
    assert (out / "pytest-cuda.xml").is_file()
    assert_at_most_8_files(out)


def test_gpu_sh_reports_a_spent_budget_and_exits_1(tmp_path):
    done, out = run_gpu_sh(
        tmp_path,
        SCHEDSCOPE_GPU_BUNDLE=str(tmp_path / "none"),
        SCHEDSCOPE_GPU_BUDGET_S="5",
        SCHEDSCOPE_GPU_BENCHMARKS="profiles",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (out / "summary.txt").read_text()
    assert "machine: skipped: the 5 s budget is spent" in summary
    assert "a step failed (steps.tsv)" in summary
    assert_at_most_8_files(out)
