"""``schedscope run --target URL`` against the real vLLM: exit 0, every request ok, a
complete report (client-side tables and pictures, vLLM's own ``/metrics`` in
``metrics.parquet``) that says plainly which engine-side sections an external engine
without spans cannot fill. With ``--target-otlp-port`` at the port vLLM exports its
spans to (tests/support/vllm_server.py), vLLM's ``llm_request`` spans, one per request,
land in ``spans.parquet``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest

from harness.report.inputs import NO_ENGINE_RECORDS
from tests.support.paths import REPO


@pytest.mark.parametrize("spans", [False, True], ids=["no-spans", "otlp-spans"])
def test_run_against_vllm_exits_0_with_a_complete_report(vllm_server, tmp_path, spans):
    out = tmp_path / "run"
    otlp = ["--target-otlp-port", str(vllm_server.otlp_port)] if spans else []
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--target",
            vllm_server.url,
            "--profile",
            "mixed",
            "--duration-scale",
            "0.05",
            "--rate-scale",
            "0.5",
            "--out",
            str(out),
            *otlp,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1].endswith("report.html")

    cell = out / "target"
    frame = pl.read_parquet(cell / "requests.parquet")
    assert frame.height > 5
    assert set(frame["status"]) == {"ok"}
    cell_run = json.loads((cell / "run.json").read_text())
    assert cell_run["counts"] == {"ok": frame.height}
    # auto prompts: this vocabulary (1,280 ids) refuses the default ids; ids below it
    prompts = json.loads((cell / "locust" / "summary.json").read_text())["prompts"]
    assert prompts["mode"] == "token_ids" and prompts["id_range"][1] <= 1280, prompts
    assert (frame["server_prompt_tokens"] == frame["prompt_tokens"]).all()

    metrics = pl.read_parquet(cell / "metrics.parquet")
    names = set(metrics["name"])
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:generation_tokens_total",
    ):
        assert name in names, name
    generated = metrics.filter(pl.col("name") == "vllm:generation_tokens_total")["value"]
    assert generated.max() - generated.min() >= frame["output_tokens"].sum()

    report_md = (out / "report.md").read_text()
    report_html = (out / "report.html").read_text()
    assert "## Per policy x class" in report_md and "| target | all |" in report_md
    assert "<svg" in report_html or "plotly" in report_html.lower()
    for frame_name in ("classes", "stalls"):
        assert (out / f"{frame_name}.parquet").is_file()
    if not spans:
        assert f"target: {NO_ENGINE_RECORDS}" in report_md
        assert not (cell / "spans.parquet").exists()
        return
    assert NO_ENGINE_RECORDS not in report_md
    received = pl.read_parquet(cell / "spans.parquet").filter(pl.col("name") == "llm_request")
    # vLLM's request id is "cmpl-<the client's X-Request-Id>-0"
    ids = {x.removeprefix("cmpl-").rsplit("-", 1)[0] for x in received["attr.gen_ai.request.id"]}
    assert set(frame["request_id"]) <= ids
    assert cell_run["otlp_spans_received"] >= frame.height
