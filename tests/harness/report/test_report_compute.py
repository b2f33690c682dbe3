"""Report computations on synthetic data with known answers (docs/report.md)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from harness.report import diagnosis, stalls, tables
from harness.report.inputs import PolicyData
from harness.report.stats import (
    jain_index,
    paired_block_bootstrap,
    percentile,
    slo_met_expr,
    time_blocks,
    weighted_percentile,
)


def test_exact_percentiles_linear_interpolation():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    # h = (n-1)p/100: p50 -> 4.5 -> 5.5; p90 -> 8.1 -> 9.1; p99 -> 8.91 -> 9.91
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile([], 50) is None
    # the table's Polars percentiles follow the same definition
    frame = _requests(ttft=values)
    g = tables.group_stats(frame, 10.0, None)
    assert g["metrics"]["ttft_s"]["p50"] == pytest.approx(5.5)
    assert g["metrics"]["ttft_s"]["p99"] == pytest.approx(9.91)
    assert g["metrics"]["ttft_s"]["max"] == 10.0


def test_weighted_percentile_is_the_inverse_weighted_cdf():
    assert weighted_percentile([0.1, 0.2], [3, 1], 50) == 0.1
    assert weighted_percentile([0.1, 0.2], [3, 1], 76) == 0.2
    assert weighted_percentile([0.1, 0.2], [1, 1], 50) == 0.1


def test_jain_index():
    assert jain_index([1, 1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([1, 2, 3]) == pytest.approx(36 / (3 * 14))


def _requests(n=None, ttft=None, classes=None, status=None, **cols) -> pl.DataFrame:
    ttft = ttft if ttft is not None else [0.1] * (n or 1)
    n = len(ttft)
    base = {
        "request_id": [f"r{i}" for i in range(n)],
        "class": classes or ["a"] * n,
        "status": status or ["ok"] * n,
        "prompt_tokens": [10] * n,
        "output_tokens": [11] * n,
        "max_tokens": [20] * n,
        "scheduled_at": [float(i) for i in range(n)],
        "ttft_s": ttft,
        "tpot_s": [0.01] * n,
        "e2e_s": [None if t is None else t + 0.1 for t in ttft],
        "queue_s": [0.0] * n,
    }
    base.update(cols)
    return tables.load_requests(pl.LazyFrame(base), {})


def test_goodput_counts_requests_meeting_every_slo_of_their_class():
    frame = pl.DataFrame(
        {
            "class": ["a", "a", "a", "b", "b"],
            "status": ["ok", "ok", "error", "ok", "ok"],
            "ttft_s": [0.5, 1.5, 0.1, 9.0, 1.0],
            "tpot_s": [0.05, 0.05, 0.05, 0.5, None],
            "e2e_s": [2.0, 2.0, 2.0, 10.0, 30.0],
        }
    )
    slos = {"a": {"ttft_s": 1.0, "tpot_s": 0.1}, "b": {"e2e_s": 20.0}}
    met = frame.select(slo_met_expr(frame.columns, slos)).to_series().to_list()
    assert met == [True, False, False, True, False]
    # per-row SLO columns win over the profile's
    frame = frame.with_columns(slo_ttft_s=pl.lit(2.0))
    met = frame.select(slo_met_expr(frame.columns, slos)).to_series().to_list()
    assert met[1] is True
    lazy = pl.LazyFrame(
        {
            "request_id": ["x", "y"],
            "class": ["a", "a"],
            "status": ["ok", "ok"],
            "ttft_s": [0.5, 2.0],
            "tpot_s": [0.01, 0.01],
            "e2e_s": [1.0, 3.0],
            "output_tokens": [5, 5],
        }
    )
    g = tables.group_stats(tables.load_requests(lazy, slos), 4.0, None)
    assert g["goodput_rps"] == pytest.approx(0.25)
    assert g["slo_attainment"] == pytest.approx(0.5)


# -- stall attribution: one hand-built case per cause ------------------------------------


def _stall_data(spans=None, steps=None, decisions=None) -> PolicyData:
    # r0 has one stall per case, each [10k, 10k + 1] with k = case number
    requests = pl.LazyFrame(
        {
            "request_id": ["r0"],
            "class": ["a"],
            "stalls": [[{"start_s": 10.0 * k, "duration_s": 1.0} for k in range(1, 7)]],
        }
    )
    return PolicyData(
        run="t",
        policy="fcfs",
        path=None,
        requests=requests,  # type: ignore[arg-type]
        spans=spans,
        steps=steps,
        decisions=decisions,
    )


def _span(name, start, end, **attrs):
    return {
        "name": name,
        "request_id": "r0",
        "start": start,
        "end": end,
        "attr.schedscope.preempt.mode": attrs.get("mode"),
        "attr.schedscope.prefill.kind": attrs.get("kind"),
    }


def test_stall_attribution_one_case_per_cause():
    spans = pl.LazyFrame(
        [
            _span("preempt", 10.2, 10.8, mode="swap"),  # 1: swapped_out
            _span("swap_out", 10.2, 10.21),
            _span("preempt", 20.2, 20.5, mode="recompute"),  # 2: recompute
            _span("prefill", 20.5, 20.9, kind="recompute"),
            _span("preempt", 30.3, 30.9),  # 3: preempted_waiting
            _span("decode", 0.0, 70.0),
        ]
    )
    # 4: the step ending the gap at 41.0 was prefill-dominated; 5: not dominated
    steps = pl.LazyFrame(
        {
            "execute_end": [41.0, 51.0, 61.0, 11.0],
            "num_prefill_tokens": [900, 0, 10, 900],
            "num_decode_seqs": [40, 40, 40, 40],
        }
    )
    # 5: an idle_running decision listed r0 inside [50, 51]; also inside 1 (lower rank there)
    decisions = pl.LazyFrame(
        {
            "kind": ["idle_running", "idle_running", "admit"],
            "time": [50.5, 10.5, 0.0],
            "request_id": [None, None, "r0"],
            "request_ids": [["r1", "r0"], ["r0"], None],
        }
    )
    data = _stall_data(pl.LazyFrame(spans.collect()), steps, decisions)
    out, sources = stalls.attribute(data, pl.DataFrame({"request_id": ["r0"], "class": ["a"]}), 0.5)
    assert out["cause"].to_list() == [
        "swapped_out",
        "recompute",
        "preempted_waiting",
        "prefill_interference",
        "token_budget",
        "other",
    ]
    assert sources == {
        "preemptions": "spans",
        "token_budget": "decisions",
        "prefill_interference": "steps",
    }
    # the threshold: gaps at or below it are not stalls
    out, _ = stalls.attribute(data, pl.DataFrame({"request_id": ["r0"], "class": ["a"]}), 1.0)
    assert out.height == 0


def test_stall_attribution_from_decisions_when_spans_are_missing():
    decisions = pl.LazyFrame(
        {
            "kind": ["preempt", "preempt", "preempt"],
            "time": [10.5, 20.5, 30.5],
            "request_id": ["r0", "r0", "r0"],
            "mode": ["swap", "recompute", None],
            "request_ids": [None, None, None],
        },
        schema_overrides={"request_ids": pl.List(pl.String)},
    )
    out, sources = stalls.attribute(
        _stall_data(decisions=decisions), pl.DataFrame({"request_id": ["r0"], "class": ["a"]}), 0.5
    )
    assert out["cause"].to_list()[:4] == ["swapped_out", "recompute", "preempted_waiting", "other"]
    assert sources["preemptions"] == "decisions"


def test_stall_threshold_default():
    assert stalls.stall_threshold(None) == 0.25
    assert stalls.stall_threshold(0.01) == 0.25
    assert stalls.stall_threshold(0.1) == pytest.approx(0.5)


# -- diagnosis: each trap constructed, and silence on healthy data -----------------------

CONFIG = {
    "scheduler": {
        "scheduling_policy": "fcfs",
        "max_num_seqs": 256,
        "max_num_batched_tokens": 64,
        "aging_rate": 0.0,
        "max_wait_s": None,
        "enable_chunked_prefill": True,
    },
    "cache": {"swap_space": 0.01, "block_size": 16, "gpu_memory_utilization": 0.9},
}


def _diag(frame, steps=None, decisions=None, policy="fcfs", fcfs_long=None, stall_frame=None):
    findings = _findings(frame, steps, decisions, policy, fcfs_long, stall_frame)
    return [f["trap"] for f in findings]


def _findings(frame, steps=None, decisions=None, policy="fcfs", fcfs_long=None, stall_frame=None):
    config = {**CONFIG, "scheduler": {**CONFIG["scheduler"], "scheduling_policy": policy}}
    data = PolicyData(
        run="t",
        policy=policy,
        path=None,
        requests=frame.lazy(),  # type: ignore[arg-type]
        steps=steps,
        decisions=decisions,
        info={"config": config},
    )
    st = (
        stall_frame
        if stall_frame is not None
        else pl.DataFrame(
            schema={
                "request_id": pl.String,
                "class": pl.String,
                "duration_s": pl.Float64,
                "cause": pl.String,
            }
        )
    )
    groups = tables.policy_groups(frame, 100.0, None)
    starv = tables.starvation(groups, frame)
    facts = diagnosis.engine_facts(data, frame)
    return diagnosis.diagnose(data, frame, st, groups, starv, facts, fcfs_long)


def _steps(idle=0, free=500):
    return pl.LazyFrame(
        {
            "num_idle_running": [idle] * 10,
            "num_running": [100] * 10,
            "num_free_device_blocks": [free] * 10,
            "num_device_blocks": [1000] * 10,
            "num_free_host_blocks": [10] * 10,
            "num_swapped": [0] * 10,
            "num_waiting": [0] * 10,
        }
    )


def _decisions(rows):
    return pl.LazyFrame(
        rows,
        schema={"kind": pl.String, "reason": pl.String, "mode": pl.String, "detail": pl.String},
        orient="row",
    )


def _healthy(n=100, queue_long=0.1, queue_short=0.1):
    classes = ["short"] * (n - 10) + ["long"] * 10
    return _requests(
        ttft=[0.1] * n,
        classes=classes,
        queue_s=[queue_short] * (n - 10) + [queue_long] * 10,
        prompt_tokens=[10] * (n - 10) + [1000] * 10,
    )


def test_healthy_run_flags_nothing():
    frame = _healthy()
    assert _diag(frame, _steps(), _decisions([("admit", "policy_order", None, None)])) == []
    assert (
        _diag(
            frame,
            _steps(),
            _decisions([("admit", "policy_order", None, None)]),
            policy="sjf",
            fcfs_long=0.1,
        )
        == []
    )
    # a handful of preemptions (below 2% of requests) is not a trap
    assert _diag(frame, _steps(), _decisions([("preempt", "out_of_blocks", "swap", "")])) == []


def test_trap_idle_running():
    decisions = _decisions([("idle_running", "token_budget", None, None)] * 5)
    assert _diag(_healthy(), _steps(idle=30), decisions) == ["idle_running"]
    # prefill-first steps (non-chunked) are not the token-budget trap
    decisions = _decisions([("idle_running", "prefill_priority", None, None)] * 5)
    assert _diag(_healthy(), _steps(idle=30), decisions) == []


def test_trap_swap_fallback():
    decisions = _decisions([("preempt", "out_of_blocks", "recompute", "swap_space_exhausted")])
    assert _diag(_healthy(), _steps(), decisions) == ["swap_fallback"]


def test_trap_starvation_under_sjf_only():
    frame = _healthy(queue_long=30.0, queue_short=0.5)
    assert _diag(frame, _steps(), None, policy="sjf", fcfs_long=3.0) == ["starvation"]
    assert _diag(frame, _steps(), None, policy="fcfs") == []
    # no worse than FCFS's long class: not starvation by SJF
    assert _diag(frame, _steps(), None, policy="sjf", fcfs_long=25.0) == []


def test_starvation_knob_gives_aging_in_the_policy_s_units():
    """SJF ages its key in tokens per second waited, priority in levels per second: an
    example of 0.1 per second (right for priority) changes nothing under SJF (measured on
    the starvation profile: the long class's p99 queue wait stays at 55 s; 100 fixes it)."""
    frame = _healthy(queue_long=30.0, queue_short=0.5)
    (sjf,) = _findings(frame, _steps(), None, policy="sjf", fcfs_long=3.0)
    assert "--aging-rate 100" in sjf["knob"] and "tokens" in sjf["knob"]
    (priority,) = _findings(frame, _steps(), None, policy="priority", fcfs_long=3.0)
    assert "--aging-rate 0.1" in priority["knob"] and "levels" in priority["knob"]


def test_trap_memory_pressure():
    frame = _requests(
        ttft=[0.1] * 99 + [None],
        status=["ok"] * 99 + ["rejected"],
        error=[None] * 99 + ["exceeds_kv_pool"],
    )
    decisions = _decisions([("reject", "exceeds_kv_pool", None, None)])
    assert _diag(frame, _steps(free=0), decisions) == ["memory_pressure"]
    decisions = _decisions([("preempt", "out_of_blocks", "swap", "swap_cheaper")] * 5)
    assert _diag(_healthy(), _steps(free=0), decisions) == ["memory_pressure"]


def test_paired_block_bootstrap_detects_a_real_difference_and_not_noise():
    rng = np.random.default_rng(1)
    t = np.sort(rng.uniform(0, 100, 2000))
    blocks = time_blocks(t, 0, 100)
    a = rng.exponential(1.0, 2000)
    ci = paired_block_bootstrap((a, blocks), (a + 0.5, blocks), lambda v: float(v.mean()))
    assert ci is not None and ci[1] < 0
    b = rng.exponential(1.0, 2000)
    ci = paired_block_bootstrap((a, blocks), (b, blocks), lambda v: float(v.mean()))
    assert ci[0] < 0 < ci[1]
    again = paired_block_bootstrap((a, blocks), (b, blocks), lambda v: float(v.mean()))
    assert again == ci  # seeded


def test_verdicts_pair_served_cells_by_schedule_offset_not_wall_clock():
    """Served cells run one after another: their scheduled_at instants never overlap, so
    arrival windows must come from schedule_offset_s. On wall-clock windows no resample
    held both cells' long requests and the CI came out None ("within noise") even for
    a 7x difference with no overlap at all (seen on a served starvation run)."""
    from harness.report.verdict import against_fcfs, verdicts

    n = 60
    offsets = [i * 0.5 for i in range(n)]
    classes = ["long" if i % 6 == 0 else "short" for i in range(n)]

    def cell(start: float, queue: float, ttft: float) -> dict:
        frame = _requests(
            ttft=[ttft] * n,
            classes=classes,
            queue_s=[queue] * n,
            schedule_offset_s=offsets,
            scheduled_at=[start + o for o in offsets],
        )
        return {"frame": frame, "duration_s": 30.0}

    policies = {"fcfs": cell(1.8e9, 2.0, 0.5), "sjf": cell(1.8e9 + 45.0, 15.0, 0.1)}
    entry = next(c for c in against_fcfs(policies, "short", "long") if c["class"] == "long")
    assert entry["ci95_of_difference"] is not None and entry["beyond_noise"], entry
    assert verdicts(policies, "short")["short_ttft"]["beyond_noise"]
    # Simulated records (no offsets) share the virtual clock's axis: still paired.
    for p in policies.values():
        p["frame"] = p["frame"].with_columns(
            scheduled_at=pl.col("schedule_offset_s"), schedule_offset_s=pl.lit(None, pl.Float64)
        )
    entry = next(c for c in against_fcfs(policies, "short", "long") if c["class"] == "long")
    assert entry["beyond_noise"], entry


def test_itl_is_exact_over_recorded_gaps_and_estimated_without_them():
    gaps = [[0.01, 0.02, 0.0], [0.5, 0.03]]  # a chunk of 2 tokens adds a 0 gap
    g = tables.group_stats(_requests(n=2, itl_s=gaps), 10.0, None)
    flat = [0.01, 0.02, 0.0, 0.5, 0.03]
    assert g["itl_s"]["source"] == "recorded_gaps" and g["itl_s"]["count"] == 5
    assert g["itl_s"]["p50"] == pytest.approx(percentile(flat, 50))
    assert g["itl_s"]["p99"] == pytest.approx(percentile(flat, 99))
    # records without gaps (the simulator's, the engine's): TPOT weighted by gaps
    g = tables.group_stats(_requests(n=2), 10.0, None)
    assert g["itl_s"]["source"] == "tpot_weighted" and g["itl_s"]["count"] == 20


def test_gaps_keep_the_requests_order_whatever_the_class_table_order():
    """The report numbers stalls in gaps() order, so stalls.parquet and the waterfall
    must not change between runs: a left join without maintain_order returned the rows
    in the class table's order (seen on every run at 20,000 requests)."""
    n = 20_000
    ids = [f"r{i}" for i in range(n)]
    requests = pl.DataFrame(
        {
            "request_id": ids,
            "stalls": [
                [{"start_s": float(i), "duration_s": 1.0}, {"start_s": i + 0.5, "duration_s": 2.0}]
                for i in range(n)
            ],
        }
    )
    classes = pl.DataFrame({"request_id": ids[::-1], "class": ["c"] * n})
    data = PolicyData(run="t", policy="fcfs", path=None, requests=requests.lazy())  # type: ignore[arg-type]
    starts = stalls.gaps(data, classes, 0.25).collect()["start_s"].to_list()
    assert starts == sorted(starts)


def test_a_run_without_engine_records_says_which_sections_it_cannot_fill(tmp_path):
    from harness.report.inputs import NO_ENGINE_RECORDS, open_policy

    client_only = {"request_id": ["r0"], "status": ["ok"], "ttft_s": [0.1]}
    pl.DataFrame(client_only).write_parquet(tmp_path / "requests.parquet")
    assert NO_ENGINE_RECORDS in open_policy("run", "target", tmp_path, {}).missing
    # engine rows joined (a served cell), or any engine-side file: no such line
    pl.DataFrame({**client_only, "queue_s": [0.0]}).write_parquet(tmp_path / "requests.parquet")
    assert NO_ENGINE_RECORDS not in open_policy("run", "target", tmp_path, {}).missing
    pl.DataFrame(client_only).write_parquet(tmp_path / "requests.parquet")
    # a spans.parquet with the columns the report reads (one without them is left out)
    spans = {"name": ["llm_request"], "request_id": ["r0"], "start": [0.0], "end": [0.2]}
    pl.DataFrame(spans).write_parquet(tmp_path / "spans.parquet")
    assert NO_ENGINE_RECORDS not in open_policy("run", "target", tmp_path, {}).missing
