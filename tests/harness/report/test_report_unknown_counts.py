"""An external engine's counts that nothing records (preemptions, recomputed tokens, ...)
read "–" in the report and null in summary.json and classes.parquet, never 0; a cell
whose engine records them keeps its figures, 0 included. A --target cell whose queue
wait came from vLLM's spans says so."""

from __future__ import annotations

import json

import polars as pl

from harness.records.request_stats import known_sum
from harness.report import ReportOptions, generate_report
from harness.report.stall_causes import CLIENT_TOKEN_TIMES

N = 8
SOURCE = {
    "source": "vLLM's llm_request spans (gen_ai.latency.*, gen_ai.usage.*)",
    "columns": ["queue_s"],
    "requests_joined": N,
    "requests": N,
}


def _client_rows() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(N)],
            "class": ["short" if i % 2 else "long" for i in range(N)],
            "status": ["ok"] * N,
            "prompt_tokens": [10] * N,
            "output_tokens": [5] * N,
            "max_tokens": [5] * N,
            "scheduled_at": [1000.0 + i for i in range(N)],
            "schedule_offset_s": [float(i) for i in range(N)],
            "ttft_s": [0.1] * N,
            "tpot_s": [0.01] * N,
            "e2e_s": [0.2] * N,
            "queue_s": [0.01 * i for i in range(N)],
        }
    )


def _write_run(root):
    target, served = root / "target", root / "fcfs"
    for cell in (target, served):
        cell.mkdir(parents=True)
    # an external engine's rows: the queue wait from its spans, no preempt columns
    _client_rows().with_columns(pl.lit("target").alias("policy")).write_parquet(
        target / "requests.parquet"
    )
    (target / "run.json").write_text(
        json.dumps({"stall_source": CLIENT_TOKEN_TIMES, "server_columns_source": SOURCE})
    )
    # the bundled engine's rows: its counts, zeros included
    _client_rows().with_columns(
        pl.lit("fcfs").alias("policy"),
        pl.Series("preempt_swaps", [0] * N),
        pl.Series("preempt_recomputes", [1] + [0] * (N - 1)),
        pl.Series("preemptions", [1] + [0] * (N - 1)),
        pl.Series("recomputed_tokens", [12] + [0] * (N - 1)),
        pl.Series("swapped_s", [0.0] * N),
        pl.Series("idle_running_steps", [0] * N),
    ).write_parquet(served / "requests.parquet")


def _table_rows(md: str) -> dict[tuple[str, str], dict[str, str]]:
    table = md.split("## Per policy x class", 1)[1].strip().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[(cells["policy"], cells["class"])] = cells
    return rows


def test_an_external_engine_s_preemptions_read_a_dash_not_zero(tmp_path):
    root = tmp_path / "run"
    _write_run(root)
    paths = generate_report([root], root, ReportOptions(resamples=20))

    rows = _table_rows(paths["markdown"].read_text())
    for cls in ("all", "short", "long"):
        target = rows[("target", cls)]
        assert (target["preempt swap"], target["preempt recompute"]) == ("–", "–"), target
        assert target["queue max"] != "–"  # the spans' queue wait is shown
    served = rows[("fcfs", "all")]
    assert (served["preempt swap"], served["preempt recompute"]) == ("0", "1")
    assert rows[("fcfs", "short")]["preempt recompute"] == "0"

    summary = json.loads(paths["summary"].read_text())
    target = summary["policies"]["target"]
    for group in (target["overall"], *target["classes"].values()):
        assert group["preemptions"] == {"swap": None, "recompute": None}
        assert group["recomputed_tokens"] is None and group["swapped_s"] is None
        assert group["idle_running_steps"] is None
    assert target["server_columns_source"] == SOURCE
    fcfs = summary["policies"]["fcfs"]["overall"]
    assert fcfs["preemptions"] == {"swap": 0, "recompute": 1}
    assert (fcfs["recomputed_tokens"], fcfs["swapped_s"]) == (12, 0.0)

    classes = pl.read_parquet(paths["classes"])
    target_rows = classes.filter(pl.col("policy") == "target")
    assert target_rows["preempt_recomputes"].null_count() == target_rows.height == 3
    assert classes.filter(pl.col("policy") == "fcfs", pl.col("class") == "all")[
        "preempt_recomputes"
    ].to_list() == [1]


def test_the_report_says_the_queue_wait_came_from_vllm_s_spans(tmp_path):
    root = tmp_path / "run"
    _write_run(root)
    paths = generate_report([root], root, ReportOptions(resamples=20))
    said = (
        "run/target: queue wait (queue p99, queue max) from vLLM's llm_request spans "
        "(gen_ai.latency.*, gen_ai.usage.*), 8 of 8 requests joined"
    )
    assert said in paths["markdown"].read_text()
    assert said.replace("'", "&#x27;") in paths["html"].read_text()
    assert "run/fcfs: queue wait" not in paths["markdown"].read_text()


def test_a_count_is_unknown_only_when_no_row_has_it():
    frame = pl.DataFrame({"n": [None, None]}, schema={"n": pl.Int64})
    assert known_sum(frame, "n") is None
    assert known_sum(frame.with_columns(pl.Series("n", [None, 0])), "n") == 0
    assert known_sum(frame.with_columns(pl.Series("n", [2, 3])), "n") == 5
    assert known_sum(frame.head(0), "n") == 0


def test_no_trap_is_claimed_for_a_cell_whose_engine_facts_are_unknown(tmp_path):
    """A --target cell has no decisions, steps or engine counts: its facts summed to 0
    and the report said 'No known trap flagged' in a green box, as if it were clean."""
    said = "trap diagnosis not possible for run/target: no engine-side records (decisions, steps)"
    root = tmp_path / "run"
    _write_run(root)
    paths = generate_report([root], root, ReportOptions(resamples=20, figures=False))
    md = paths["markdown"].read_text()
    diagnosis = md.split("## Diagnosis", 1)[1].split("\n## ", 1)[0]
    assert said in diagnosis
    assert "run/fcfs: KV pool full" in diagnosis  # fcfs was diagnosed: its preemption
    summary = json.loads(paths["summary"].read_text())
    assert summary["undiagnosed"] == [
        {"run": "run", "policy": "target", "why": "no engine-side records (decisions, steps)"}
    ]
    # the target alone: nothing was diagnosed, so nothing is said to be clean
    alone = tmp_path / "alone"
    (alone / "target").mkdir(parents=True)
    for name in ("requests.parquet", "run.json"):
        (alone / "target" / name).write_bytes((root / "target" / name).read_bytes())
    paths = generate_report([alone], alone, ReportOptions(resamples=20, figures=False))
    md = paths["markdown"].read_text()
    assert "trap diagnosis not possible for alone/target" in md
    assert "No known trap flagged" not in md
    page = paths["html"].read_text()
    assert "No known trap flagged" not in page and "trap diagnosis not possible" in page
    # beside a served cell that is diagnosed and clean: that one is said to be clean
    served = root / "fcfs" / "requests.parquet"
    pl.read_parquet(served).with_columns(
        pl.lit(0).alias(c) for c in ("preemptions", "preempt_recomputes", "recomputed_tokens")
    ).write_parquet(served)
    md = generate_report([root], root, ReportOptions(resamples=20, figures=False))[
        "markdown"
    ].read_text()
    assert said in md and "No known trap flagged" in md
