"""What a target or a file wrote (error messages, request ids, class and cell names, run
labels) reaches report.md and report.html inert: no live HTML in either, and no table
cell split by a ``|`` (docs/report.md, "Outputs")."""

from __future__ import annotations

import html
import re

import polars as pl

from harness.report import ReportOptions, generate_report
from harness.report.render import md
from tests.support.gate_runs import requests_frame, write_run

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
SVG = '"><svg onload=alert(1)>'
PAYLOADS = (SCRIPT, IMG, SVG)
#: Any tag a payload would open, as it would appear raw.
RAW_TAG = re.compile(r"<\s*(script>alert|img src=x|svg onload)", re.IGNORECASE)


def _hostile_run(tmp_path):
    """Failed requests whose errors are the payloads, a class named by one (with a pipe),
    a request id holding one, a run directory and a cell named by them."""
    frame = requests_frame(seed=1, n=60)
    failed = pl.int_range(pl.len()) < 6
    frame = frame.with_columns(
        pl.when(failed).then(pl.lit("error")).otherwise(pl.col("status")).alias("status"),
        pl.when(failed)
        .then(pl.lit(f"upstream said {SCRIPT} | {IMG}"))
        .otherwise(None)
        .cast(pl.String)
        .alias("error"),
        pl.when(pl.int_range(pl.len()) % 2 == 0)
        .then(pl.lit(f"short{SVG}|x"))
        .otherwise(pl.col("class"))
        .alias("class"),
        pl.when(pl.int_range(pl.len()) == 7)
        .then(pl.lit(IMG))
        .otherwise(pl.col("request_id"))
        .alias("request_id"),
    )
    other = requests_frame(seed=2, n=60)
    root = tmp_path / f"run{IMG}"
    return write_run(root, {"fcfs": frame, f"sjf-{SVG}": other})


def test_markdown_escapes_html_and_table_pipes():
    assert md(SCRIPT) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert md("a | b & c") == "a \\| b &amp; c"
    assert md("two\nlines") == "two lines"


def test_report_md_carries_no_live_html(tmp_path):
    root = _hostile_run(tmp_path)
    paths = generate_report([root], tmp_path / "out", ReportOptions(resamples=20))
    text = paths["markdown"].read_text()
    assert not RAW_TAG.search(text), RAW_TAG.search(text)
    for payload in PAYLOADS:
        assert payload not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    # every row of the class table has as many cells as its header: no pipe splits one
    table = text.split("## Per policy x class", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    cells = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
    assert len(rows) > 3 and len(cells) == 1, cells


def test_report_html_escapes_every_payload(tmp_path):
    root = _hostile_run(tmp_path)
    paths = generate_report([root], tmp_path / "out", ReportOptions(resamples=20))
    page = paths["html"].read_text()
    for payload in PAYLOADS:
        assert payload not in page
    assert not RAW_TAG.search(page), page[RAW_TAG.search(page).start() - 200 :][:400]
    assert html.escape(SCRIPT) in page  # the error message, shown as text
    assert html.escape(SVG) in page  # the class and the cell name
