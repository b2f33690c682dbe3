"""benchmarks/bench_vllm.py's side-by-side table from small synthetic runs (no vLLM):
the latencies come from each engine's report summary, class by class; the counts are
the rise of each counter over the scrapes, summed over label sets; an engine without a
figure shows "–"."""

from __future__ import annotations

import json

import polars as pl
import pytest

from benchmarks.bench_vllm import (
    EngineRun,
    counter_increase,
    read_engine_run,
    render_table,
    side_by_side,
    status_line,
)


def _group(ttft_p50: float, itl_p95: float, ok: int = 10) -> dict:
    return {
        "requests": ok + 1,
        "counts": {"ok": ok, "error": 1, "rejected": 0, "aborted": 0},
        "throughput_rps": ok / 5.0,
        "output_tokens_per_s": ok * 20.0,
        "metrics": {
            "ttft_s": {"p50": ttft_p50, "p95": 2 * ttft_p50},
            "e2e_s": {"p50": 1.0, "p95": 1.5},
        },
        "itl_s": {"p50": itl_p95 / 2, "p95": itl_p95},
        "generator_lag_s": {"p99": 0.002},
    }


def _summary(scale: float) -> dict:
    return {
        "overall": _group(0.1 * scale, 0.02 * scale),
        "classes": {
            "short": _group(0.05 * scale, 0.01 * scale, 6),
            "long": _group(0.2 * scale, 0.03 * scale, 4),
        },
        "errors": {"failed": 1},
    }


def _metrics(rows: list[tuple[float, str, dict, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "timestamp": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "labels": [json.dumps(r[2], sort_keys=True) for r in rows],
            "value": [r[3] for r in rows],
        }
    )


A, B = {"engine": "0", "model_name": "m"}, {"engine": "1", "model_name": "m"}
VLLM_METRICS = _metrics(
    [
        # scraped out of order: the rise is last - first in time, per label set
        (2.0, "vllm:num_preemptions_total", A, 15.0),
        (1.0, "vllm:num_preemptions_total", A, 10.0),
        (1.0, "vllm:num_preemptions_total", B, 3.0),
        (2.0, "vllm:num_preemptions_total", B, 4.0),
        (1.0, "vllm:iteration_tokens_total_count", A, 100.0),
        (2.0, "vllm:iteration_tokens_total_count", A, 300.0),
        (1.0, "vllm:iteration_tokens_total_sum", A, 1000.0),
        (2.0, "vllm:iteration_tokens_total_sum", A, 2600.0),
        (1.0, "vllm:prefix_cache_hits_total", A, 0.0),
        (2.0, "vllm:prefix_cache_hits_total", A, 64.0),
        (1.0, "vllm:prefix_cache_queries_total", A, 0.0),
        (2.0, "vllm:prefix_cache_queries_total", A, 512.0),
        (1.0, "vllm:request_queue_time_seconds_sum", A, 1.0),
        (2.0, "vllm:request_queue_time_seconds_sum", A, 1.5),
        (1.0, "vllm:request_queue_time_seconds_count", A, 10.0),
        (2.0, "vllm:request_queue_time_seconds_count", A, 20.0),
    ]
)
BUNDLED_METRICS = _metrics(
    [
        (1.0, "vllm:num_preemptions_total", A, 0.0),
        (2.0, "vllm:num_preemptions_total", A, 0.0),
        (1.0, "vllm:iteration_tokens_total_count", A, 0.0),
        (2.0, "vllm:iteration_tokens_total_count", A, 400.0),
        (1.0, "vllm:iteration_tokens_total_sum", A, 0.0),
        (2.0, "vllm:iteration_tokens_total_sum", A, 1000.0),
    ]
)
BUNDLED_STEPS = pl.DataFrame({"step": [0, 1, 2, 3], "num_seqs": [1, 2, 3, 6]})


#: Sent 0, 1.0 and 0 s after their scheduled instants; the last failed.
REQUESTS = pl.DataFrame(
    {
        "status": ["ok", "ok", "error"],
        "scheduled_at": [10.0, 11.0, 12.0],
        "sent_at": [10.0, 12.0, 12.0],
        "ttft_s": [0.2, 1.4, None],
    }
)


def _rows() -> dict[str, dict]:
    runs = {
        "vllm": EngineRun(_summary(1.0), VLLM_METRICS, requests=REQUESTS),
        "bundled": EngineRun(_summary(2.0), BUNDLED_METRICS, BUNDLED_STEPS),
    }
    return dict(side_by_side(runs))


def test_a_counter_s_rise_is_summed_over_its_label_sets():
    assert counter_increase(VLLM_METRICS, "vllm:num_preemptions_total") == 6.0
    assert counter_increase(VLLM_METRICS, "vllm:no_such_total") is None
    assert counter_increase(None, "vllm:num_preemptions_total") is None


def test_the_counts_are_each_engine_s_own_and_absent_ones_are_none():
    rows = _rows()
    assert rows["preemptions (/metrics)"] == {"vllm": 6.0, "bundled": 0.0}
    assert rows["engine steps (/metrics)"] == {"vllm": 200.0, "bundled": 400.0}
    assert rows["tokens per step (/metrics)"] == {"vllm": 8.0, "bundled": 2.5}
    assert rows["prefix-cache hits (/metrics, tokens)"] == {"vllm": 64.0, "bundled": None}
    assert rows["engine queue time mean (/metrics)"]["vllm"] == pytest.approx(0.05)
    assert rows["engine queue time mean (/metrics)"]["bundled"] is None
    assert rows["steps (step records)"] == {"vllm": None, "bundled": 4.0}
    # the send lag taken out: 0.2 and 1.4 - 1.0 s; the failed request left out
    assert rows["TTFT after send p50 all"] == {"vllm": pytest.approx(0.3), "bundled": None}
    assert rows["TTFT after send p95 all"]["vllm"] == pytest.approx(0.39)
    assert rows["running seqs per step (step records)"] == {"vllm": None, "bundled": 3.0}


def test_the_latencies_come_from_each_class_of_each_engine_s_summary():
    rows = _rows()
    assert rows["TTFT p50 short"] == {"vllm": 0.05, "bundled": 0.1}
    assert rows["TTFT p95 long"] == {"vllm": pytest.approx(0.4), "bundled": pytest.approx(0.8)}
    assert rows["ITL p95 all"] == {"vllm": 0.02, "bundled": 0.04}
    assert rows["E2E p95 long"] == {"vllm": 1.5, "bundled": 1.5}
    assert rows["requests/s"] == {"vllm": 2.0, "bundled": 2.0}
    assert rows["errors"] == {"vllm": 1, "bundled": 1}
    assert rows["generator send lag p99"] == {"vllm": 0.002, "bundled": 0.002}
    names = list(rows)
    assert (
        names.index("output tokens/s")
        < names.index("TTFT p50 all")
        < names.index("preemptions (/metrics)")
    )


def test_the_table_prints_dashes_for_what_an_engine_lacks_and_the_ratio():
    table = render_table(
        side_by_side(
            {
                "vllm": EngineRun(_summary(1.0), VLLM_METRICS),
                "bundled": EngineRun(_summary(2.0), BUNDLED_METRICS, BUNDLED_STEPS),
            }
        )
    )
    lines = table.splitlines()
    assert lines[0] == "| figure | vLLM | bundled | bundled / vLLM |"
    assert "| TTFT p50 short | 50.0 ms | 100.0 ms | 2.00x |" in lines
    assert "| prefix-cache hits (/metrics, tokens) | 64 | – | – |" in lines
    assert "| preemptions (/metrics) | 6 | 0 | 0.00x |" in lines
    assert "| steps (step records) | – | 4 | – |" in lines
    assert "| tokens per step (/metrics) | 8.00 | 2.50 | 0.31x |" in lines


def test_an_engine_run_is_read_from_schedscope_run_s_files(tmp_path):
    cell = tmp_path / "vllm"
    cell.mkdir()
    summary = {"policies": {"vllm": _summary(1.0)}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    VLLM_METRICS.write_parquet(cell / "metrics.parquet")
    failures = [{"kind": "generator_limited", "message": "..."}]
    (cell / "run.json").write_text(json.dumps({"status": "degraded", "failures": failures}))
    REQUESTS.write_parquet(cell / "requests.parquet")
    run = read_engine_run(tmp_path, "vllm")
    assert run.summary == summary["policies"]["vllm"]
    assert run.metrics is not None and run.metrics.equals(VLLM_METRICS)
    assert run.steps is None
    assert run.status == "degraded (generator_limited)"
    assert run.requests is not None and run.requests.equals(REQUESTS)
    ok = EngineRun({}, status="ok")
    assert status_line({"vllm": run, "bundled": ok}) == (
        "cells: vLLM degraded (generator_limited); bundled ok"
    )


def test_without_vllm_s_virtualenv_the_benchmark_stops_at_once_saying_how_to_make_it(tmp_path):
    import os
    import subprocess
    import sys

    from harness.bench.script import SKIPPED_EXIT
    from tests.support.paths import REPO

    missing = tmp_path / "no-venv" / "bin" / "python"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_vllm.py"), "--quick"],
        env={**os.environ, "SCHEDSCOPE_VLLM_PYTHON": str(missing)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == SKIPPED_EXIT, done.stdout + done.stderr  # skipped, not crashed
    said = done.stdout + done.stderr
    assert f"skipped: vLLM's virtualenv is missing ({missing} is not there)" in said
    assert "make .venv-vllm/.schedscope-vllm-installed" in said
    assert not (tmp_path / "no-venv").exists()
