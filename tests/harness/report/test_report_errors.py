"""Why requests failed: the error summary, and the report saying it first."""

from __future__ import annotations

import json

import polars as pl

from harness.report import ReportOptions, generate_report
from harness.report.errors import HIGH_ERROR_RATE, cut, error_summary, lines


def _frame(statuses: list[str], errors: list[str | None], http: list[int | None]) -> pl.DataFrame:
    n = len(statuses)
    ok = [s == "ok" for s in statuses]
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "class": ["a" if i % 2 else "b" for i in range(n)],
            "status": statuses,
            "error": errors,
            "http_status": http,
            "prompt_tokens": [10] * n,
            "output_tokens": [5 if k else 0 for k in ok],
            "max_tokens": [5] * n,
            "scheduled_at": [1000.0 + i for i in range(n)],
            "schedule_offset_s": [float(i) for i in range(n)],
            "ttft_s": [0.1 if k else None for k in ok],
            "tpot_s": [0.01 if k else None for k in ok],
            "e2e_s": [0.2 if k else None for k in ok],
        },
        schema_overrides={"http_status": pl.Int64, "error": pl.String},
    )


def _vocab_failures(n_failed: int, n_ok: int) -> pl.DataFrame:
    return _frame(
        ["error"] * n_failed + ["ok"] * n_ok,
        [f"Token id {2000 + i} is out of vocabulary" for i in range(n_failed)] + [None] * n_ok,
        [400] * n_failed + [200] * n_ok,
    )


def test_messages_are_grouped_by_their_shape_and_the_run_s_own_cuts_are_not_failures():
    frame = _frame(
        ["error", "error", "rejected", "aborted", "aborted", "aborted", "ok"],
        [
            "Token id 2032 is out of vocabulary",
            "Token id 2045 is out of vocabulary",
            "too many requests",
            "not sent: the run stopped before its scheduled instant",
            "in flight when the run stopped",
            "stream broken: " + "x" * 500,
            None,
        ],
        [400, 400, 429, None, None, None, 200],
    )
    s = error_summary(frame)
    assert s["requests"] == 7 and s["failed"] == 4
    assert s["error_rate"] == round(4 / 7, 6)
    top = s["top"]
    assert top[0]["count"] == 2 and top[0]["message"] == "Token id 2032 is out of vocabulary"
    assert top[0]["numbers_vary"] and top[0]["http_statuses"] == {"400": 2}
    assert {g["message"][:15] for g in top[1:]} == {"too many reques", "stream broken: "}
    assert all(len(g["message"]) <= 200 for g in top)
    assert cut("a  b\n c") == "a b c" and cut("y" * 300).endswith("...")
    said = lines("cell", s)
    assert said[0] == "cell: 4 of 7 requests failed (57.1%)"
    assert said[1] == "  2x error 400: Token id 2032 is out of vocabulary (numbers vary)"
    assert lines("cell", error_summary(_frame(["ok"], [None], [200]))) == []


def test_the_report_says_a_high_error_rate_before_its_verdicts_and_diagnosis(tmp_path):
    root = tmp_path / "run"
    for name, frame in (("fcfs", _vocab_failures(9, 1)), ("sjf", _vocab_failures(0, 10))):
        (root / name).mkdir(parents=True)
        frame.with_columns(pl.lit(name).alias("policy")).write_parquet(
            root / name / "requests.parquet"
        )
        prompts = {
            "requested": "auto",
            "mode": "token_ids",
            "reason": "the server refused ids 1000 and 2999",
            "vocab_bound": 1240,
            "id_range": [310, 1240],
            "max_model_len": 2048,
        }
        (root / name / "run.json").write_text(json.dumps({"prompts": prompts}))
    paths = generate_report([root], root, ReportOptions(resamples=20))
    md = paths["markdown"].read_text()
    assert "- prompts: token ids in [310, 1240) (auto: the server refused ids 1000 and 2999)" in md
    verdicts = md.split("## Verdicts", 1)[1].split("## Diagnosis", 1)[0]
    first = verdicts.strip().splitlines()[0]
    assert first.startswith("- **HIGH ERROR RATE: run/fcfs: 9 of 10 requests failed (90.0%)")
    assert "9x error 400: Token id 2000 is out of vocabulary (numbers vary)" in first
    diagnosis = md.split("## Diagnosis", 1)[1].split("## Per policy", 1)[0]
    assert diagnosis.strip().splitlines()[0] == "### run/fcfs: 9 of 10 requests failed (90.0%)"
    assert "### run/sjf" not in diagnosis  # nothing failed there
    # client rows only (no engine record): no trap diagnosis, and said
    assert "trap diagnosis not possible for run/sjf: no engine-side records" in diagnosis
    summary = json.loads(paths["summary"].read_text())
    errs = summary["policies"]["fcfs"]["errors"]
    assert errs["failed"] == 9 and errs["error_rate"] > HIGH_ERROR_RATE
    assert summary["policies"]["sjf"]["errors"]["failed"] == 0
    assert summary["policies"]["fcfs"]["prompts"]["id_range"] == [310, 1240]
    page = paths["html"].read_text()
    assert 'data-errors="high"' in page and "prompts: token ids in [310, 1240)" in page
