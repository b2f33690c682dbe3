"""`schedscope run --target` against a server with a small vocabulary (~1,250 ids).

The target is tests/support/vllm_stub.py, standing in for vLLM (which cannot run in the
tests): it refuses prompt ids at or above its vocabulary with vLLM's error text, as the
run that motivated this did (169 of 170 requests failed, exit 0, the console saying
only "error 126, ok 1"). Each test is a real `schedscope run` (Locust in a subprocess)
of tests/data/locust_small.py (3 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest

from tests.support.paths import DATA, REPO
from tests.support.vllm_stub import VllmStub

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("own_store")]


def run_target(url: str, out, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "harness.cli", "run", "--target", url, "--profile"]
    command += [str(DATA / "locust_small.py"), "--duration-scale", "1", "--grace", "10"]
    return subprocess.run(
        [*command, "--out", str(out), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_auto_prompts_stay_inside_the_target_s_vocabulary(tmp_path):
    out = tmp_path / "run"
    with VllmStub(vocab_size=1250, max_model_len=2048) as stub:
        proc = run_target(stub.url, out)
        refused = stub.refused
    assert proc.returncode == 0, proc.stdout + proc.stderr
    frame = pl.read_parquet(out / "target" / "requests.parquet")
    assert (frame["status"] == "ok").all(), frame["error"].unique().to_list()
    assert (frame["server_prompt_tokens"] == frame["prompt_tokens"]).all()
    assert refused == 1  # the vocabulary probe, nothing else
    prompts = json.loads((out / "target" / "run.json").read_text())["prompts"]
    assert prompts["requested"] == "auto" and prompts["mode"] == "token_ids"
    assert prompts["vocab_bound"] <= 1250 and prompts["id_range"][1] == prompts["vocab_bound"]
    assert prompts["max_model_len"] == 2048
    line = f"prompts: token ids in [{prompts['id_range'][0]}, {prompts['id_range'][1]}) (auto: "
    assert line in proc.stdout
    assert line in (out / "report.md").read_text()
    assert "why requests failed" not in proc.stdout


def test_token_ids_beyond_the_vocabulary_fail_the_run_with_the_servers_words(tmp_path):
    """LOCUST_PROMPT_MODE reaches the run (it had no effect), here asking for the
    default token ids, which the target refuses."""
    out = tmp_path / "run"
    with VllmStub(vocab_size=1250) as stub:
        proc = run_target(stub.url, out, env={"LOCUST_PROMPT_MODE": "token_ids"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    text = proc.stdout
    assert "why requests failed" in text and "is out of vocabulary (numbers vary)" in text
    assert "error rate over --max-error-rate 0.05: target" in text
    info = json.loads((out / "target" / "run.json").read_text())
    assert info["prompts"]["requested"] == "token_ids"
    assert "--prompt-mode" in info["locust_command"]
    assert info["errors"]["error_rate"] > 0.05
    assert "is out of vocabulary" in info["errors"]["top"][0]["message"]
    verdicts = (out / "report.md").read_text().split("## Verdicts", 1)[1]
    assert verdicts.strip().startswith("- **HIGH ERROR RATE: run/target:")
