"""`schedscope run --target` against an external engine that stalls and sends its spans
over OTLP/gRPC, as vLLM's default exporter does.

The target is tests/support/vllm_stub.py (vLLM cannot run in the tests): every streamed
completion of 3 tokens or more pauses 0.4 s after its second token, and each completion
is an ``llm_request`` span exported by the official OTel SDK's OTLP/gRPC exporter to the
run's ``--target-otlp-grpc-port``. One real run (Locust in a subprocess) of
tests/data/locust_small.py (3 s): the client's gaps above the served stall threshold are
the cell's stalls, named "unknown: external engine" in the report with "–" in the engine's
own causes; the spans land in spans.parquet.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from harness.report.stall_causes import CAUSE_LABELS, CLIENT_TOKEN_TIMES, STALL_CAUSES
from tests.harness.run.test_run_target_vocabulary import run_target
from tests.support.ports import free_port
from tests.support.vllm_stub import VllmStub

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("own_store")]

STALL_S = 0.4


def _stall_row(report_md: str, cell: str) -> dict[str, str]:
    """The stall table's row of ``cell`` in report.md, by header."""
    lines = report_md.splitlines()
    start = next(i for i, line in enumerate(lines) if "(n / s)" in line)
    headers = [h.strip() for h in lines[start].strip("|").split("|")]
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        values = [v.strip() for v in line.strip("|").split("|")]
        if values[1] == cell:
            return dict(zip(headers, values, strict=True))
    raise AssertionError(f"no stall row for {cell}")


def test_target_stalls_from_client_token_times_and_spans_over_otlp_grpc(tmp_path):
    out = tmp_path / "run"
    port = free_port()
    with VllmStub(
        vocab_size=50000, stall_s=STALL_S, otlp_grpc_endpoint=f"http://127.0.0.1:{port}"
    ) as stub:
        proc = run_target(stub.url, out, "--target-otlp-grpc-port", str(port))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = out / "target"
    info = json.loads((cell / "run.json").read_text())
    frame = pl.read_parquet(cell / "requests.parquet")
    assert (frame["status"] == "ok").all()

    # Stalls: every request streamed 3 tokens or more paused after its second token.
    assert info["stall_source"] == CLIENT_TOKEN_TIMES
    paused = frame.filter(pl.col("output_tokens") >= 3)
    assert paused.height >= 20
    for row in paused.iter_rows(named=True):
        second_token = row["first_token_at"] + row["itl_s"][0]
        # the pause as the client saw it: at most the second chunk's delay shorter
        long = [s for s in row["stalls"] if s["duration_s"] > 0.75 * STALL_S]
        assert long and abs(long[0]["start_s"] - second_token) < 1e-6, row["request_id"]
        assert row["num_stalls"] == len(row["stalls"]) >= 1
        assert row["stall_s"] == sum(s["duration_s"] for s in row["stalls"])
    total = int(frame["num_stalls"].sum())

    report = json.loads((out / "summary.json").read_text())
    overall = report["runs"]["run"]["policies"]["target"]["overall"]
    assert overall["stalls"] == total >= paused.height
    assert overall["stalls_by_cause"]["external_unknown"]["count"] == total
    row = _stall_row((out / "report.md").read_text(), "target")
    assert row[f"{CAUSE_LABELS['external_unknown']} (n / s)"].startswith(f"{total} / ")
    for cause in STALL_CAUSES:
        if cause != "external_unknown":
            assert row[f"{cause} (n / s)"] == "–", cause
    assert "stalls from client token times" in (out / "report.md").read_text()
    stall_rows = pl.read_parquet(out / "stalls.parquet")
    assert set(stall_rows["cause"]) == {"external_unknown"}

    # Spans: one llm_request per request, received over OTLP/gRPC.
    assert info["otlp_grpc_receiver"] == f"http://127.0.0.1:{port}"
    spans = pl.read_parquet(cell / "spans.parquet")
    roots = spans.filter(pl.col("name") == "llm_request")
    assert set(roots["attr.gen_ai.request.id"]) >= set(frame["request_id"])
    assert info["otlp_spans_received"] == spans.height >= frame.height
