"""``schedscope run --target URL`` against the real vLLM: exit 0, every request ok, a
complete report (client-side tables and pictures, vLLM's own ``/metrics`` in
``metrics.parquet``) that says plainly which engine-side sections an external engine
without spans cannot fill (its preemptions "–", never 0). With ``--target-otlp-port``
at the port vLLM exports its spans to (tests/support/vllm_server.py), vLLM's
``llm_request`` spans, one per request, land in ``spans.parquet`` with schedscope's
request id, every request joins its span, and the queue wait the report shows is
vLLM's (``gen_ai.latency.time_in_queue``), said to be so. The report's prefix cache shows
vLLM's own: each request's cached tokens as vLLM answered them, and vLLM's hit rate over
the load from its counters (a client repeating shared prefixes runs beside the load)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading

import polars as pl
import pytest

from harness.report.inputs import NO_ENGINE_RECORDS
from tests.support.paths import REPO
from tests.vllm.test_vllm_prefix_cache import cache_config, schedule, send

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def run(url: str, out, otlp: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--target",
            url,
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


def send_shared_prefixes(url: str, stop: threading.Event) -> None:
    """test_vllm_prefix_cache's schedule, again and again, one request at a time, until
    ``stop`` (each round's suffixes its own: the prefixes hit, the suffixes do not)."""
    block_size = int(cache_config(url)["block_size"])
    for round_ in itertools.count():
        for prompt in schedule(block_size):
            if stop.is_set():
                return
            send(url, prompt[:-1] + [(prompt[-1] + round_) % 1000 + 100])


def check_prefix_cache(entry: dict, frame: pl.DataFrame, metrics: pl.DataFrame, md: str) -> None:
    """The report's prefix cache for the vLLM cell: on (vLLM V1's default, from its
    vllm:cache_config_info), the run's own requests' cached tokens as vLLM answered them,
    and vLLM's hit rate over the load from its counters' increase, as metrics.parquet
    holds them, beside it."""
    assert entry["enabled"] is True, entry
    assert frame["cached_tokens"].null_count() == 0  # --enable-prompt-tokens-details
    cached, prompt = frame["cached_tokens"].sum(), frame["prompt_tokens"].sum()
    assert entry["overall"]["hit_rate"] == pytest.approx(cached / prompt)

    def increase(name: str) -> float:
        series = (
            metrics.filter(pl.col("name") == name).group_by("timestamp").agg(pl.col("value").sum())
        )
        return series.sort("timestamp")["value"][-1] - series.sort("timestamp")["value"][0]

    counters = entry["counters"]
    used = counters["rates"][counters["used"]]
    expected = increase("vllm:prompt_tokens_cached_total") / increase("vllm:prompt_tokens_total")
    assert used["hit_rate"] == pytest.approx(expected)
    assert used["hit_rate"] > 0  # the shared prefixes sent beside the run hit
    assert "Prefix cache" in md


@pytest.mark.parametrize("spans", [False, True], ids=["no-spans", "otlp-spans"])
def test_run_against_vllm_exits_0_with_a_complete_report(vllm_server, tmp_path, spans):
    out = tmp_path / "run"
    otlp = ["--target-otlp-port", str(vllm_server.otlp_port)] if spans else []
    # Beside the run's own load (prompts that share nothing), a client repeating shared
    # prefixes: vLLM's prefix-cache counters over the run then count hits.
    stop = threading.Event()
    sender = threading.Thread(target=send_shared_prefixes, args=(vllm_server.url, stop))
    sender.start()
    try:
        done = run(vllm_server.url, out, otlp)
    finally:
        stop.set()
        sender.join(120)
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
    summary = json.loads((out / "summary.json").read_text())["policies"]["target"]
    check_prefix_cache(summary["prefix_cache"], frame, metrics, report_md)
    # vLLM's preemptions are in no per-request record: unknown, never 0
    assert summary["overall"]["preemptions"] == {"swap": None, "recompute": None}
    table = report_md.split("## Per policy x class", 1)[1].split("\n#", 1)[0]
    target_rows = [line for line in table.splitlines() if line.startswith("| run | target |")]
    assert target_rows and all("| – | – |" in line for line in target_rows), target_rows
    if not spans:
        assert f"target: {NO_ENGINE_RECORDS}" in report_md
        assert not (cell / "spans.parquet").exists()
        assert "queue_s" not in frame.columns
        return
    assert NO_ENGINE_RECORDS not in report_md
    received = pl.read_parquet(cell / "spans.parquet").filter(pl.col("name") == "llm_request")
    # vLLM's request id is "cmpl-<the client's X-Request-Id>-0": the join recovers it
    assert all(
        engine_id == f"cmpl-{request_id}-0"
        for engine_id, request_id in received.select("attr.gen_ai.request.id", "request_id")
        .drop_nulls()
        .iter_rows()
    )
    assert set(frame["request_id"]) <= set(received["request_id"])
    assert cell_run["otlp_spans_received"] >= frame.height
    # every request joined its span: vLLM's queue wait and token counts in its row
    assert frame["queue_s"].null_count() == 0 and (frame["queue_s"] >= 0).all()
    assert (frame["engine_output_tokens"] == frame["output_tokens"]).all()
    assert (frame["engine_prompt_tokens"] == frame["prompt_tokens"]).all()
    assert (frame["first_scheduled_at"] >= frame["engine_arrival_at"]).all()
    source = cell_run["server_columns_source"]
    assert source["requests_joined"] == source["requests"] == frame.height
    assert summary["server_columns_source"] == source
    assert summary["overall"]["metrics"]["queue_s"]["count"] == frame.height
    assert f"run/target: queue wait (queue p99, queue max) from {source['source']}" in report_md
