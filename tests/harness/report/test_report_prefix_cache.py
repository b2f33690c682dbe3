"""The report's prefix cache (docs/report.md, "Prefix cache") and trap 5, cache thrash
(docs/traps.md): exact hit rates per class on hand-made rows, the TTFT with a hit and
without, "not recorded" (never 0%) where no request carries ``cached_tokens``, a
target's cumulative counters taken as their increase over the load, and the trap on
the engine's own records of prompts sharing prefixes: a pool too small for them
thrashes, a roomy one does not."""

from __future__ import annotations

import json
import shlex

import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from harness.cli import app
from harness.report import ReportOptions, build_report, diagnosis, generate_report, tables
from harness.report import prefix_cache as pc
from harness.report.inputs import PolicyData
from tests.support.prefix_runs import (
    PREFIX_LEN,
    PREFIXES,
    PROFILE,
    ROOMY_BLOCKS,
    THRASH_BLOCKS,
    shared_prefix_requests,
    write_prefix_run,
)

OPTIONS = ReportOptions(resamples=20, figures=False)
ON = {"cache": {"enable_prefix_caching": True, "block_size": 16}}

# -- per request: exact hit rates, the TTFT split, "not recorded" -----------------------

#: (class, status, prompt, cached, ttft, first_scheduled_at, evicted_prefix_tokens)
ROWS = [
    ("chat", "ok", 100, 0, 0.4, 1.0, 0),
    ("chat", "ok", 100, 50, 0.1, 2.0, 10),
    ("chat", "ok", 100, 80, 0.2, 3.0, 0),
    ("chat", "ok", 200, 0, 0.6, 4.0, 40),
    # never admitted: its 1000 prompt tokens are in no hit rate
    ("chat", "rejected", 1000, 0, None, None, 0),
    ("agent", "ok", 50, 48, 0.05, 5.0, 0),
    # admitted, then failed: in the hit rate, not in the TTFT split
    ("agent", "error", 50, 0, None, 6.0, 2),
    # the target sent no cached_tokens for these: not recorded
    ("batch", "ok", 300, None, 0.3, None, None),
    ("batch", "ok", 300, None, 0.3, None, None),
]


def _rows(rows=ROWS, **drop) -> pl.DataFrame:
    n = len(rows)
    frame = pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "class": [r[0] for r in rows],
            "status": [r[1] for r in rows],
            "prompt_tokens": [r[2] for r in rows],
            "cached_tokens": [r[3] for r in rows],
            "ttft_s": [r[4] for r in rows],
            "first_scheduled_at": [r[5] for r in rows],
            "evicted_prefix_tokens": [r[6] for r in rows],
            "output_tokens": [4] * n,
            "max_tokens": [4] * n,
            "scheduled_at": [float(i) for i in range(n)],
            "e2e_s": [None if r[4] is None else r[4] + 0.1 for r in rows],
        },
        schema_overrides={"cached_tokens": pl.Int64, "evicted_prefix_tokens": pl.Int64},
    )
    return frame.drop(*drop) if drop else frame


def _data(frame: pl.DataFrame, config=ON, steps=None, metrics=None) -> PolicyData:
    return PolicyData(
        run="t",
        policy="fcfs",
        path=None,  # type: ignore[arg-type]
        requests=frame.lazy(),
        steps=steps,
        metrics=metrics,
        info={"config": config},
    )


def _prefix(frame: pl.DataFrame, **kw) -> dict | None:
    data = _data(frame, **kw)
    return pc.prefix_cache(data, tables.load_requests(data.requests, {}))


def test_hit_rate_per_class_over_admitted_requests_with_known_cached_tokens():
    steps = pl.LazyFrame({"num_evicted_blocks": [0, 3, 4]})
    out = _prefix(_rows(), steps=steps)
    assert out is not None
    assert out["enabled"] is True and out["enabled_source"] == "engine config"
    assert out["source"] == pc.REQUEST_SOURCE
    chat, agent, batch = (out["by_class"][c] for c in ("chat", "agent", "batch"))
    assert (chat["requests"], chat["prompt_tokens"], chat["cached_tokens"]) == (4, 500, 130)
    assert chat["hit_rate"] == pytest.approx(130 / 500)
    assert chat["requests_with_hit"] == 2
    assert (agent["prompt_tokens"], agent["cached_tokens"]) == (100, 48)
    assert agent["hit_rate"] == pytest.approx(0.48)
    # overall: 178 of 600 (the rejected request's 1000 tokens and the batch's are out)
    assert out["hit_rate"] == pytest.approx(178 / 600)
    assert out["overall"]["requests"] == 6
    # TTFT of finished requests with a hit (0.1, 0.2) and without (0.4, 0.6)
    assert chat["ttft_hit_p50_s"] == pytest.approx(0.15)
    assert chat["ttft_hit_p95_s"] == pytest.approx(0.195)
    assert chat["ttft_miss_p50_s"] == pytest.approx(0.5)
    assert chat["ttft_miss_p95_s"] == pytest.approx(0.59)
    assert agent["ttft_hit_p50_s"] == pytest.approx(0.05)
    assert agent["ttft_miss_count"] == 0 and agent["ttft_miss_p50_s"] is None
    # evictions: blocks from the steps, prefix tokens from the admitted rows
    assert out["evicted_blocks"] == 7
    assert (chat["evicted_prefix_tokens"], agent["evicted_prefix_tokens"]) == (50, 2)
    assert out["evicted_prefix_tokens"] == 52
    # a class whose requests carry no cached_tokens: unknown, not 0
    assert batch["recorded"] is False and batch["requests"] == 0
    assert batch["hit_rate"] is None and batch["cached_tokens"] is None
    assert batch["evicted_prefix_tokens"] is None


def test_no_cached_tokens_column_is_not_recorded_and_caching_off_is_said():
    out = _prefix(_rows(**{"cached_tokens": True}))
    # caching on, no request says what it found: nothing to rate
    assert out is not None and out["enabled"] is True
    assert out["hit_rate"] is None and out["overall"] is None and out["by_class"] == {}
    assert out["source"] is None
    off = _prefix(_rows(), config={"cache": {"enable_prefix_caching": False}})
    assert off is not None and off["enabled"] is False and off["note"] == pc.CACHING_OFF
    assert off["hit_rate"] is None and off["by_class"] == {}
    # nothing known at all (no config, no column, no counters): no entry
    assert _prefix(_rows(**{"cached_tokens": True}), config={}) is None


def _write_cell(root, frame: pl.DataFrame, config: dict | None, metrics=None, steps=None):
    cell = root / "fcfs"
    cell.mkdir(parents=True)
    frame.write_parquet(cell / "requests.parquet")
    if metrics is not None:
        metrics.write_parquet(cell / "metrics.parquet")
    if steps is not None:
        steps.write_parquet(cell / "steps.parquet")
    if config is not None:
        summary = {"mode": "simulate", "profile": "mixed", "policies": {"fcfs": {"config": config}}}
        (root / "summary.json").write_text(json.dumps(summary))
    return root


def _section(md: str) -> str:
    return md.split("## Prefix cache", 1)[1].split("\n## ", 1)[0]


def test_the_report_renders_the_hit_rates_and_not_recorded(tmp_path):
    root = _write_cell(tmp_path / "run", _rows(), ON)
    paths = generate_report([root], options=OPTIONS)
    summary = json.loads(paths["summary"].read_text())
    entry = summary["policies"]["fcfs"]["prefix_cache"]
    assert entry["by_class"]["chat"]["hit_rate"] == pytest.approx(0.26)
    assert entry["by_class"]["batch"]["hit_rate"] is None
    section = _section(paths["markdown"].read_text())
    rows = {
        line.split("|")[3].strip(): [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| run ")
    }
    assert rows["chat"][6] == "26.0%" and rows["agent"][6] == "48.0%"
    assert rows["all"][6] == "29.7%"
    assert rows["batch"][6] == "not recorded"
    assert "0.0%" not in section
    page = paths["html"].read_text()
    assert 'id="prefix-cache"' in page and "not recorded" in page


def test_the_report_says_not_recorded_or_off_never_zero(tmp_path):
    root = _write_cell(tmp_path / "on", _rows(**{"cached_tokens": True}), ON)
    md = generate_report([root], options=OPTIONS)["markdown"].read_text()
    section = _section(md)
    assert "hit rate not recorded" in section and "%" not in section
    root = _write_cell(tmp_path / "off", _rows(), {"cache": {"enable_prefix_caching": False}})
    md = generate_report([root], options=OPTIONS)["markdown"].read_text()
    assert "fcfs: prefix caching off (engine config)" in _section(md)
    assert "%" not in _section(md)
    # nothing known: no section, and summary.json's key is null
    root = _write_cell(tmp_path / "none", _rows(**{"cached_tokens": True}), None)
    paths = generate_report([root], options=OPTIONS)
    assert "## Prefix cache" not in paths["markdown"].read_text()
    assert json.loads(paths["summary"].read_text())["policies"]["fcfs"]["prefix_cache"] is None


# -- a target's cumulative counters: the increase over the load --------------------------


def _metrics(samples: list[tuple[float, str, dict, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(t, name, json.dumps(labels, sort_keys=True), v) for t, name, labels, v in samples],
        schema={
            "timestamp": pl.Float64,
            "name": pl.String,
            "labels": pl.String,
            "value": pl.Float64,
        },
        orient="row",
    )


CACHED, TOTAL = "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total"
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
E0, E1 = {"engine": "0", "model_name": "m"}, {"engine": "1", "model_name": "m"}


def _counter_samples() -> list:
    """Engine 0's counters are already high at the first scrape (earlier cells, the
    warm-up); engine 1's series first appear mid-load (they were 0 before)."""
    out = []
    for t, cached, total in (
        (100, 500, 2000),
        (101, 520, 2100),
        (102, 560, 2300),
        (103, 600, 2400),
    ):
        out += [(t, CACHED, E0, cached), (t, TOTAL, E0, total)]
    for t, cached, total in ((102, 30, 100), (103, 50, 300)):
        out += [(t, CACHED, E1, cached), (t, TOTAL, E1, total)]
    # V1's inflated pair (a waiting request re-counted): present, not preferred
    for t, hits, queries in ((100, 9000, 10000), (103, 9900, 10500)):
        out += [(t, HITS, E0, hits), (t, QUERIES, E0, queries)]
    out.append((100, pc.CACHE_CONFIG_INFO, {"enable_prefix_caching": "True", "engine": "0"}, 1.0))
    return out


def test_counters_are_taken_as_their_increase_over_the_load():
    metrics = _metrics(_counter_samples()).lazy()
    # engine 0 rose 100 / 400; engine 1 from 0 (absent at the first scrape): 50 / 300
    assert pc.counter_increase(metrics, CACHED, start=100.0) == 150
    assert pc.counter_increase(metrics, TOTAL, start=100.0) == 700
    out = pc.target_counters(metrics)
    assert out is not None
    assert out["used"] == f"{CACHED} / {TOTAL}"
    assert (out["cached_tokens"], out["prompt_tokens"]) == (150, 700)
    # neither the last values (650 / 2700) nor engine 0 alone (100 / 400)
    assert out["hit_rate"] == pytest.approx(150 / 700)
    assert (out["first_scrape"], out["last_scrape"], out["scrapes"]) == (100, 103, 4)
    inflated = out["rates"][f"{HITS} / {QUERIES}"]
    assert inflated["hit_rate"] == pytest.approx(900 / 500) and inflated["note"]


def test_a_restarted_target_s_counter_counts_from_zero_after_the_drop():
    samples = [(100, CACHED, E0, 1000), (101, CACHED, E0, 1100), (102, CACHED, E0, 50)]
    samples += [(103, CACHED, E0, 80)]
    assert pc.counter_increase(_metrics(samples).lazy(), CACHED) == 100 + 50 + 30
    # one scrape: no increase to take
    assert pc.counter_increase(_metrics(samples[:1]).lazy(), CACHED) is None


def test_counters_fall_back_to_the_source_split_then_hits_over_queries():
    by_source = "vllm:prompt_tokens_by_source_total"
    samples = []
    for t, compute, hit in ((10, 100, 40), (20, 400, 240)):
        samples += [
            (t, by_source, {"source": "local_compute"}, compute),
            (t, by_source, {"source": "local_cache_hit"}, hit),
            (t, HITS, {}, 7.0 * t),
            (t, QUERIES, {}, 10.0 * t),
        ]
    out = pc.target_counters(_metrics(samples).lazy())
    assert out is not None and out["used"].startswith(by_source)
    assert out["hit_rate"] == pytest.approx(200 / 500)
    only_v1 = [s for s in samples if s[1] != by_source]
    out = pc.target_counters(_metrics(only_v1).lazy())
    assert out is not None and out["used"] == f"{HITS} / {QUERIES}"
    assert out["hit_rate"] == pytest.approx(0.7) and "admission" in out["note"]


def test_a_target_cell_reports_its_counters_and_its_per_request_counts(tmp_path):
    """A --target cell: no engine config, no steps or decisions; the target sent
    usage.prompt_tokens_details.cached_tokens for some requests, and metrics.parquet
    holds its counters."""
    rows = [(c, s, p, k, t, None, None) for c, s, p, k, t, *_ in ROWS]
    frame = _rows(rows).drop("first_scheduled_at", "evicted_prefix_tokens")
    root = _write_cell(tmp_path / "run", frame, None, metrics=_metrics(_counter_samples()))
    paths = generate_report([root], options=OPTIONS)
    entry = json.loads(paths["summary"].read_text())["policies"]["fcfs"]["prefix_cache"]
    assert entry["enabled"] is True and entry["enabled_source"] == pc.CACHE_CONFIG_INFO
    # per request: the finished ones that carry it (the error and the rejection have no
    # admission time: not counted), 178 - 0 of 600 - 50
    assert entry["source"] == pc.REQUEST_SOURCE
    assert entry["hit_rate"] == pytest.approx(178 / 550)
    assert entry["counters"]["hit_rate"] == pytest.approx(150 / 700)
    assert entry["evicted_blocks"] is None and entry["evicted_prefix_tokens"] is None
    section = _section(paths["markdown"].read_text())
    assert f"{CACHED} / {TOTAL} rose 150 / 700 between its first and last scrape" in section
    assert "hit rate 21.4%" in section
    # without per-request counts the counters give the hit rate, and say which
    frame = frame.drop("cached_tokens")
    root = _write_cell(tmp_path / "bare", frame, None, metrics=_metrics(_counter_samples()))
    paths = generate_report([root], options=OPTIONS)
    entry = json.loads(paths["summary"].read_text())["policies"]["fcfs"]["prefix_cache"]
    assert entry["hit_rate"] == pytest.approx(150 / 700)
    assert entry["source"] == f"metrics.parquet: {CACHED} / {TOTAL} (increase over the load)"
    assert entry["by_class"] == {}


# -- trap 5: cache thrash on the engine's own records -------------------------------------


@pytest.fixture(scope="module")
def prefix_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    thrash = write_prefix_run(root / "thrash", THRASH_BLOCKS)
    roomy = write_prefix_run(root / "roomy", ROOMY_BLOCKS)
    return thrash, roomy


def _traps(report) -> list[dict]:
    return [f for rr in report.runs for p in rr.policies.values() for f in p.findings]


def test_a_pool_too_small_for_the_shared_prefixes_thrashes(prefix_runs):
    thrash, _ = prefix_runs
    report = build_report([thrash], OPTIONS)
    (finding,) = _traps(report)
    assert finding["trap"] == "cache_thrash"
    ev = finding["evidence"]
    # every reuse found its prefix evicted: (120 - 6) reuses x 64 tokens
    reused = (120 - PREFIXES) * PREFIX_LEN
    decisions = pl.read_parquet(thrash / "decisions.parquet").filter(pl.col("kind") == "admit")
    assert ev["evicted_prefix_tokens"] == decisions["num_evicted_prefix_tokens"].sum() == reused
    assert ev["prefix_queried_tokens"] == decisions["num_tokens"].sum()
    assert ev["evicted_prefix_share"] >= diagnosis.THRASH_SHARE
    assert (
        ev["evicted_blocks"]
        == pl.read_parquet(thrash / "steps.parquet")["num_evicted_blocks"].sum()
    )
    assert ev["evicted_blocks"] > 0 and ev["hit_rate"] == 0.0
    assert ev["hit_rate_light_load"] == 0.0 and ev["hit_rate_heavy_load"] == 0.0
    assert ev["num_device_blocks"] == THRASH_BLOCKS
    assert "--num-gpu-blocks-override (now 64" in finding["knob"]
    assert "--max-num-seqs (now 64)" in finding["knob"]
    assert finding["worst_requests"][0]["evicted_prefix_tokens"] == PREFIX_LEN
    p = report.runs[0].policies["fcfs"]
    assert p.prefix_cache is not None and p.prefix_cache["hit_rate"] == 0.0


def test_a_roomy_pool_keeps_the_prefixes_and_flags_nothing(prefix_runs):
    _, roomy = prefix_runs
    report = build_report([roomy], OPTIONS)
    assert _traps(report) == []
    p = report.runs[0].policies["fcfs"]
    # each prefix computed once: every reuse hit its 64 tokens
    n, suffix = 120, 8
    assert p.prefix_cache is not None
    assert p.prefix_cache["hit_rate"] == pytest.approx(
        (n - PREFIXES) * PREFIX_LEN / (n * (PREFIX_LEN + suffix))
    )
    assert p.prefix_cache["evicted_prefix_tokens"] == 0
    assert p.facts["evicted_prefix_tokens"] == 0


def test_a_small_run_that_evicts_does_not_flag(tmp_path):
    """Twelve requests on the small pool: all six reuses miss (384 tokens, 44%) but under
    THRASH_MIN_TOKENS."""
    run = write_prefix_run(tmp_path / "small", THRASH_BLOCKS, requests=shared_prefix_requests(12))
    report = build_report([run], OPTIONS)
    facts = report.runs[0].policies["fcfs"].facts
    assert facts["evicted_prefix_tokens"] == PREFIXES * PREFIX_LEN < diagnosis.THRASH_MIN_TOKENS
    assert _traps(report) == []


def test_caching_off_never_thrashes(tmp_path):
    run = write_prefix_run(tmp_path / "off", THRASH_BLOCKS, enable_prefix_caching=False)
    report = build_report([run], OPTIONS)
    assert _traps(report) == []
    assert report.runs[0].policies["fcfs"].prefix_cache["enabled"] is False


def test_the_command_is_a_schedscope_simulate_line_with_twice_the_blocks(prefix_runs, tmp_path):
    thrash, _ = prefix_runs
    (finding,) = _traps(build_report([thrash], OPTIONS))
    args = shlex.split(finding["command"])
    assert args[:2] == ["schedscope", "simulate"]
    flags = dict(zip(args[2::2], args[3::2], strict=False))
    assert flags["--profile"] == PROFILE and flags["--policy"] == "fcfs"
    assert flags["--seed"] == "7" and flags["--block-size"] == "4"
    assert flags["--num-gpu-blocks-override"] == str(2 * THRASH_BLOCKS)
    assert flags["--out"] == "runs/thrash-fcfs-more-kv"
    # the flags parse as `schedscope simulate`'s ...
    command = typer.main.get_command(app)
    simulate = command.commands["simulate"]  # type: ignore[attr-defined]
    ctx = simulate.make_context("simulate", args[2:])
    assert ctx.params["num_gpu_blocks_override"] == 2 * THRASH_BLOCKS
    # ... and run (a few requests of the profile, into this test's directory)
    out = tmp_path / "fixed"
    result = CliRunner().invoke(
        app,
        [*args[1:-2], "--out", str(out), "--num-requests", "20", "--no-speed-band"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    config = json.loads((out / "summary.json").read_text())["policies"]["fcfs"]["config"]
    assert config["cache"]["num_gpu_blocks_override"] == 2 * THRASH_BLOCKS


def test_the_finding_and_its_command_are_rendered(prefix_runs, tmp_path):
    thrash, _ = prefix_runs
    paths = generate_report([thrash], tmp_path / "out", OPTIONS)
    summary = json.loads(paths["summary"].read_text())
    (finding,) = summary["diagnosis"]
    assert finding["trap"] == "cache_thrash" and finding["command"].startswith("schedscope")
    assert summary["policies"]["fcfs"]["findings"] == ["cache_thrash"]
    md = paths["markdown"].read_text()
    assert f"- command: `{finding['command']}`" in md
    assert "(`cache_thrash`)" in md
    page = paths["html"].read_text()
    assert 'data-trap="cache_thrash"' in page and 'class="command"' in page


def test_load_halves_split_the_admissions_by_the_running_count():
    """Four admitted requests: two admitted while 1 sequence ran (hits), two while 9 ran
    (misses); the as-of join finds the step of each admission."""
    frame = _rows(
        [
            ("a", "ok", 100, 60, 0.1, 1.0, 0),
            ("a", "ok", 100, 0, 0.1, 2.0, 64),
            ("a", "ok", 100, 40, 0.1, 3.0, 0),
            ("a", "ok", 100, 0, 0.1, 4.05, 64),
        ]
    )
    steps = pl.LazyFrame(
        {"schedule_start": [0.5, 1.0, 2.0, 3.0, 4.0], "num_running": [0, 1, 9, 1, 9]}
    )
    data = _data(frame, steps=steps)
    halves = diagnosis.load_halves(data, tables.load_requests(data.requests, {}))
    assert halves is not None and halves["by"] == "running sequences at the first admission"
    assert halves["light"] == {"requests": 2, "hit_rate": 0.5, "mean_running": 1.0}
    assert halves["heavy"] == {"requests": 2, "hit_rate": 0.0, "mean_running": 9.0}
    # without steps: by order of admission
    data = _data(frame)
    halves = diagnosis.load_halves(data, tables.load_requests(data.requests, {}))
    assert halves is not None and halves["by"] == "order of first admission"
    assert halves["light"]["hit_rate"] == pytest.approx(0.3)
    assert halves["heavy"]["hit_rate"] == pytest.approx(0.2)


def _diagnose_decisions(rows: list[tuple[str, int, int, int]]) -> tuple[list[str], dict]:
    """The traps of a cell whose decisions are ``rows`` (kind, num_tokens,
    num_cached_tokens, num_evicted_prefix_tokens), with steps that evicted blocks."""
    decisions = pl.LazyFrame(
        [(k, None, None, None, n, c, e) for k, n, c, e in rows],
        schema={
            "kind": pl.String,
            "reason": pl.String,
            "mode": pl.String,
            "detail": pl.String,
            "num_tokens": pl.Int64,
            "num_cached_tokens": pl.Int64,
            "num_evicted_prefix_tokens": pl.Int64,
        },
        orient="row",
    )
    n = 10
    steps = pl.LazyFrame(
        {
            "num_idle_running": [0] * n,
            "num_running": [1] * n,
            "num_free_device_blocks": [10] * n,
            "num_device_blocks": [100] * n,
            "num_free_host_blocks": [10] * n,
            "num_swapped": [0] * n,
            "num_waiting": [0] * n,
            "num_evicted_blocks": [5] * n,
        }
    )
    data = PolicyData(
        run="t",
        policy="fcfs",
        path=None,  # type: ignore[arg-type]
        requests=_rows().lazy(),
        steps=steps,
        decisions=decisions,
        info={"config": {**ON, "scheduler": {"scheduling_policy": "fcfs", "max_num_seqs": 8}}},
    )
    frame = tables.load_requests(data.requests, {})
    facts = diagnosis.engine_facts(data, frame)
    stalls = pl.DataFrame(
        schema={"request_id": pl.String, "duration_s": pl.Float64, "cause": pl.String}
    )
    groups = tables.policy_groups(frame, 10.0, None)
    found = diagnosis.diagnose(data, frame, stalls, groups, None, facts, None)
    return [f["trap"] for f in found], facts


def test_the_rule_reads_first_admissions_at_its_thresholds():
    admits = [("admit", 1000, 0, 0)] * 10
    # a recompute that found its own blocks evicted is traps 2 and 4's, not a thrash
    traps, facts = _diagnose_decisions([*admits, ("recompute", 5000, 0, 4000)])
    assert traps == [] and facts["evicted_prefix_tokens"] == 0
    assert facts["prefix_queried_tokens"] == 10_000 and facts["evicted_blocks"] == 50
    # 1,000 of 10,000 first-admission tokens (10%, and 1,000): flagged
    lost = [("admit", 1000, 0, 100)] * 10
    traps, facts = _diagnose_decisions(lost)
    assert traps == ["cache_thrash"] and facts["evicted_prefix_tokens"] == 1000
    # just under the share (1,980 of 20,000: 9.9%), or under the minimum (999): not
    assert _diagnose_decisions([("admit", 1000, 0, 99)] * 20)[0] == []
    assert _diagnose_decisions([("admit", 1000, 0, 999)])[0] == []
