"""A served engine under SCHEDSCOPE_FAULT (engine/faults.py), as ``schedscope run``
starts one: a ``schedscope serve`` subprocess that inherits the variable. Its engine
process plants the delay (the sim executor sleeps it on the wall clock), says so in its
log and in /health; a bad fault keeps the server from starting (exit 2, the key named).

The delay is asserted as a lower bound only (a sleep lasts at least what it was asked):
no timing is compared with anything else."""

from __future__ import annotations

import os
import subprocess
import sys

import polars as pl
import pytest

from engine.faults import ENV_VAR
from harness.serve.local_server import CliServer, HttpClient
from tests.support.paths import REPO
from tests.support.served import health

pytestmark = [pytest.mark.slow]

#: Far above a built-in cost model step (~ms): what the step records must show.
DELAY_S = 0.2
BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True}


def test_the_served_steps_show_the_planted_decode_delay(tmp_path):
    steps = tmp_path / "steps.parquet"
    args = ["--executor", "sim", "--record-steps", str(steps)]
    with CliServer(args, env={ENV_VAR: f"decode_step_delay_s={DELAY_S}"}) as server:
        status, body = health(server.url)
        assert status == 200 and body["faults"] == {"decode_step_delay_s": DELAY_S}
        status, _, raw = HttpClient(server.url).post_json("/v1/completions", BODY)
        assert status == 200, raw
        server.terminate()
        assert server.wait(60) == 0, server.output()
        output = server.output()
    assert f"SCHEDSCOPE_FAULT active: decode_step_delay_s={DELAY_S}" in output
    frame = pl.read_parquet(steps).with_columns(
        (pl.col("execute_end") - pl.col("execute_start")).alias("execute_s")
    )
    decodes = frame.filter(pl.col("num_decode_seqs") > 0)
    assert decodes.height == BODY["max_tokens"] - 1, frame  # the first token: the prefill
    assert (decodes["execute_s"] >= DELAY_S - 1e-6).all(), decodes["execute_s"].to_list()


def test_without_faults_health_reports_none(tmp_path):
    with CliServer(["--executor", "sim", "--engine-core", "thread"], env={ENV_VAR: ""}) as server:
        assert health(server.url)[1]["faults"] == {}
        output = server.output()
    assert "SCHEDSCOPE_FAULT" not in output


def test_a_bad_fault_keeps_the_server_from_starting():
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--executor", "sim", "--port", "0"],
        cwd=REPO,
        env={**os.environ, ENV_VAR: "prefill_token_delay_s=1ms"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "prefill_token_delay_s" in proc.stderr
    assert "schedscope serving on" not in proc.stdout + proc.stderr
