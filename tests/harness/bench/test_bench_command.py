"""`schedscope bench` / `python -m benchmarks`: runs the chosen benchmarks (fake ones
written into tmp_path, and one real one in quick mode), prints one table, writes one
results file, and exits 0 / 1 / 2 as docs/benchmarks.md says."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from typer.testing import CliRunner

from harness.bench.collect import collect
from harness.bench.runner import CRASHED, OK, SKIPPED, TIMED_OUT, run_benchmark
from harness.cli import app
from harness.run.server import repo_env
from tests.support.fake_benchmarks import CRASHES, GOOD, HANGS, SKIPS, write
from tests.support.paths import REPO


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


def table_row(output: str, benchmark: str, figure: str) -> list[str]:
    """The cells of the table's row for ``figure`` (columns are 2+ spaces apart)."""
    (row,) = [line for line in output.splitlines() if line.startswith(benchmark) and figure in line]
    return re.split(r"\s{2,}", row.strip())


def test_a_run_prints_one_table_and_writes_the_results(tmp_path):
    folder = write(tmp_path / "benchmarks", good=GOOD)
    out = tmp_path / "results.json"
    result = bench("--dir", str(folder), "--out", str(out), "--quick")
    assert result.exit_code == 0, result.output  # a missed target is no failure
    assert "size 10, quick True" in result.output  # its own lines, in quick mode
    assert "benchmark  figure" in result.output
    assert table_row(result.output, "good", "latency") == [
        "good",
        "latency",
        "0.500 ms",
        "<= 1 ms",
        "met",
    ]
    assert table_row(result.output, "good", "throughput") == [
        "good",
        "throughput",
        "90.0 tokens/s",
        ">= 100 tokens/s",
        "missed",
    ]
    assert table_row(result.output, "good", "size") == [
        "good",
        "size",
        "10.0 requests",
        "no target",
    ]
    data = json.loads(out.read_text())
    assert {"date", "fingerprint", "versions", "figures", "benchmarks"} <= set(data)
    assert data["fingerprint"]["machine_key"] and data["fingerprint"]["description"]
    assert data["versions"]["python"] and "polars" in data["versions"]
    assert data["date"].endswith("+00:00") and data["quick"] is True
    assert [(f["benchmark"], f["name"], f["verdict"]) for f in data["figures"]] == [
        ("good", "latency", "met"),
        ("good", "throughput", "missed"),
        ("good", "size", "no target"),
    ]
    assert data["summary"]["met"] == 1 and data["summary"]["missed"] == 1
    assert data["benchmarks"][0]["status"] == OK


def test_fail_on_miss_makes_a_missed_target_exit_1(tmp_path):
    folder = write(tmp_path / "benchmarks", good=GOOD)
    result = bench("--dir", str(folder), "--out", str(tmp_path / "r.json"), "--fail-on-miss")
    assert result.exit_code == 1, result.output


def test_a_crashing_benchmark_is_reported_and_the_rest_still_run(tmp_path):
    folder = write(tmp_path / "benchmarks", crashes=CRASHES, good=GOOD)
    out = tmp_path / "r.json"
    result = bench("--dir", str(folder), "--out", str(out), "--quiet")
    assert result.exit_code == 1, result.output
    assert table_row(result.output, "crashes", "-") == ["crashes", "-", "-", "crashed (exit 1)"]
    assert "latency" in result.output  # bench_good ran after it
    assert "fake benchmark fell over" not in result.output.split("benchmark  figure")[1]
    data = json.loads(out.read_text())
    crashed = data["benchmarks"][0]
    assert crashed["status"] == CRASHED and "the fake benchmark fell over" in crashed["error"]
    assert data["summary"]["failed"] == ["crashes"]


def test_a_benchmark_this_machine_cannot_run_is_skipped_with_its_reason_not_failed(tmp_path):
    folder = write(tmp_path / "benchmarks", skips=SKIPS, good=GOOD)
    out = tmp_path / "r.json"
    result = bench("--dir", str(folder), "--out", str(out), "--quiet")
    assert result.exit_code == 0, result.output  # skipped is not crashed
    assert table_row(result.output, "skips", "-") == [
        "skips",
        "-",
        "-",
        "skipped: the fake accelerator is not here: plug one in",
    ]
    assert "latency" in result.output  # bench_good ran too
    data = json.loads(out.read_text())
    status = {b["name"]: b["status"] for b in data["benchmarks"]}
    assert status == {"good": OK, "skips": SKIPPED}
    assert data["summary"]["skipped"] == ["skips"] and data["summary"]["failed"] == []


def test_a_benchmark_past_its_timeout_is_killed_and_reported(tmp_path):
    (benchmark,) = collect(write(tmp_path / "benchmarks", hangs=HANGS))
    result = run_benchmark(benchmark, timeout_s=2, echo=None)
    assert result.status == TIMED_OUT and "sleeping" in result.error


def test_a_subset_runs_only_what_is_named(tmp_path):
    folder = write(tmp_path / "benchmarks", crashes=CRASHES, good=GOOD)
    result = bench("--dir", str(folder), "--only", "good", "--out", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    assert "crashes" not in result.output


def test_an_unknown_name_is_a_usage_error_naming_it(tmp_path):
    folder = write(tmp_path / "benchmarks", good=GOOD)
    result = bench("--dir", str(folder), "good", "nosuch")
    assert result.exit_code == 2
    assert "nosuch" in result.output and "known: good" in result.output
    assert bench("--device", "tpu").exit_code == 2


def test_cuda_where_there_is_none_is_a_usage_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = bench("--device", "cuda", "model")
    assert result.exit_code == 2 and "no CUDA device" in result.output


def test_list_names_every_benchmark_and_runs_none():
    result = bench("--list")
    assert result.exit_code == 0
    assert "serving" in result.output and "Served vs offline" in result.output
    assert len(result.output.strip().splitlines()) == len(collect())


def test_python_m_benchmarks_runs_a_real_benchmark_in_quick_mode(tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "profiles", "--quick", "--out", str(out)],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    names = [f["name"] for f in json.loads(out.read_text())["figures"]]
    assert names == [
        "100,000 draws of each length distribution kind",
        "sample_requests per 100,000 requests",
    ]
    assert "<= 2 s" in done.stdout  # the table has the target the script prints


def test_a_benchmark_still_runs_alone_as_a_script(tmp_path):
    out = tmp_path / "f.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_profiles.py", "--quick", "--json", str(out)],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "beside target <= 0.5 s" in done.stdout  # its own printed lines
    assert json.loads(out.read_text())["quick"] is True
