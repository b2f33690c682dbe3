"""The verdicts' checks can fail: an interval needs enough arrival windows holding rows of
both policies, equal values are a tie with no winner, goodput without SLOs says it is a
rate of finished requests, a generator-limited cell is said, and verdicts over different
requests say so (docs/report.md, "Verdicts")."""

from __future__ import annotations

import numpy as np
import polars as pl

from harness.report import tables
from harness.report.stats import MIN_SHARED_BLOCKS, paired_block_bootstrap, time_blocks
from harness.report.verdict import against_fcfs, verdicts


def _frame(
    e2e: list[float], offsets: list[float] | None = None, classes=None, status=None
) -> pl.DataFrame:
    n = len(e2e)
    offsets = offsets if offsets is not None else [float(i) for i in range(n)]
    return tables.load_requests(
        pl.LazyFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "class": classes or ["short" if i % 2 else "long" for i in range(n)],
                "status": status or ["ok"] * n,
                "prompt_tokens": [10] * n,
                "output_tokens": [11] * n,
                "max_tokens": [20] * n,
                "schedule_offset_s": offsets,
                "scheduled_at": [1.7e9 + o for o in offsets],
                "ttft_s": [e / 10 for e in e2e],
                "tpot_s": [0.01] * n,
                "e2e_s": e2e,
                "queue_s": [e / 20 for e in e2e],
            }
        ),
        {},
    )


def _cell(frame: pl.DataFrame, duration_s: float = 100.0) -> dict:
    return {"frame": frame, "duration_s": duration_s}


def test_one_window_or_one_request_per_side_is_too_few_to_tell():
    """One ok request per side, or every row in one arrival window: each resample drew
    the same rows, the interval was (d, d) and the verdict 'beyond run-to-run noise'."""
    one = np.array([1.0]), np.array([2.0])
    blocks = time_blocks(np.array([0.0]), 0.0, 1.0)
    assert paired_block_bootstrap((one[0], blocks), (one[1], blocks), np.mean) is not None
    assert (
        paired_block_bootstrap(
            (one[0], blocks), (one[1], blocks), np.mean, min_shared_blocks=MIN_SHARED_BLOCKS
        )
        is None
    )
    # one request each
    policies = {"fcfs": _cell(_frame([1.0])), "sjf": _cell(_frame([2.0]))}
    tail = verdicts(policies, None)["tail_e2e"]
    assert tail["ci95_of_difference"] is None and not tail["beyond_noise"]
    assert "too few requests to tell" in tail["sentence"]
    assert "beyond run-to-run noise" not in tail["sentence"]
    # 100 requests a side, all but one (an error at the end) in the first window
    offsets = [i * 0.001 for i in range(99)] + [100.0]
    status = ["ok"] * 99 + ["error"]
    rng = np.random.default_rng(3)
    fcfs = _frame(list(1.0 + rng.uniform(0, 0.1, 100)), offsets, status=status)
    sjf = _frame(list(2.0 + rng.uniform(0, 0.1, 100)), offsets, status=status)
    policies = {"fcfs": _cell(fcfs), "sjf": _cell(sjf)}
    for entry in verdicts(policies, "short").values():
        if entry["title"].startswith("best tail") or "TTFT" in entry["title"]:
            assert entry["ci95_of_difference"] is None, entry
            assert "beyond run-to-run noise" not in entry["sentence"], entry["sentence"]
    for entry in against_fcfs(policies, "short", "long"):
        assert entry["ci95_of_difference"] is None and not entry["beyond_noise"], entry
        assert "too few requests to tell" in entry["sentence"], entry["sentence"]


def test_enough_shared_windows_still_tell_a_real_difference():
    n = 400
    offsets = list(np.linspace(0, 100, n))
    rng = np.random.default_rng(4)
    fcfs = _frame(list(1.0 + rng.uniform(0, 0.1, n)), offsets)
    sjf = _frame(list(2.0 + rng.uniform(0, 0.1, n)), offsets)
    tail = verdicts({"fcfs": _cell(fcfs), "sjf": _cell(sjf)}, None)["tail_e2e"]
    assert tail["beyond_noise"] and "beyond run-to-run noise" in tail["sentence"]


def test_equal_values_are_a_tie_that_names_no_winner():
    """Goodput 0.000 for both policies printed 'fcfs has the best goodput: 0.000 req/s
    against sjf's 0.000 req/s'; equal values against FCFS printed 'raises'."""
    n = 40
    failed = ["error"] * n
    offsets = list(np.linspace(0, 100, n))
    same = [1.0 + (i % 7) / 10 for i in range(n)]
    policies = {
        "fcfs": _cell(_frame(same, offsets, status=failed)),
        "sjf": _cell(_frame(same, offsets, status=failed)),
    }
    goodput = verdicts(policies, None)["goodput"]
    assert goodput["tie"] and goodput["tied"] == ["fcfs", "sjf"], goodput
    assert goodput["winner"] is None and not goodput["beyond_noise"]
    assert goodput["sentence"].startswith("fcfs and sjf tie on goodput: 0.000 req/s each")
    assert "has the best" not in goodput["sentence"]
    # equal to FCFS: unchanged, neither lowered nor raised
    policies = {"fcfs": _cell(_frame(same, offsets)), "sjf": _cell(_frame(same, offsets))}
    tail = verdicts(policies, "short")["tail_e2e"]
    assert tail["sentence"].startswith("fcfs and sjf tie on p99 E2E: ")
    for entry in against_fcfs(policies, "short", "long"):
        assert entry["tie"] and not entry["lower_than_fcfs"] and not entry["beyond_noise"]
        assert entry["sentence"].startswith("SJF leaves "), entry["sentence"]
        assert "unchanged against FCFS" in entry["sentence"]
        assert "raises" not in entry["sentence"] and "lowers" not in entry["sentence"]
    # a difference in the 9th significant digit is a tie; a real one is not
    close = {
        "fcfs": _cell(_frame(same, offsets)),
        "sjf": _cell(_frame([v * (1 + 1e-12) for v in same], offsets)),
    }
    assert verdicts(close, None)["tail_e2e"]["tie"]
    apart = {
        "fcfs": _cell(_frame(same, offsets)),
        "sjf": _cell(_frame([v * 1.01 for v in same], offsets)),
    }
    assert not verdicts(apart, None)["tail_e2e"]["tie"]
    assert verdicts(apart, None)["tail_e2e"]["winner"] == "fcfs"


def test_goodput_without_slos_says_it_is_a_rate_of_finished_requests(tmp_path):
    """With no profile resolved, slo_met is just status == ok: 'the best goodput' was
    throughput under another name."""
    import json

    from harness.report import ReportOptions, generate_report
    from tests.support.gate_runs import requests_frame, write_run

    said = "(no SLOs known: goodput here is finished requests per second)"
    cells = {"fcfs": requests_frame(seed=1, n=200), "sjf": requests_frame(seed=2, n=200, errors=50)}
    options = ReportOptions(figures=False, resamples=20)
    unknown = write_run(tmp_path / "unknown", cells, profile="no-such-profile")
    summary = json.loads(generate_report([unknown], unknown, options)["summary"].read_text())
    goodput = summary["verdicts"]["goodput"]
    assert goodput["slos_known"] is False
    assert goodput["sentence"].startswith(f"fcfs has the best goodput {said}: "), goodput
    # the other verdicts are not about SLOs
    assert said not in summary["verdicts"]["tail_e2e"]["sentence"]
    known = write_run(tmp_path / "known", cells, profile="mixed")
    summary = json.loads(generate_report([known], known, options)["summary"].read_text())
    assert summary["verdicts"]["goodput"]["slos_known"] is True
    assert said not in summary["verdicts"]["goodput"]["sentence"]


LIMITED = (
    "generator-limited: p99 send lag 200.0 ms (limit 100 ms), 0 requests waited for the "
    "in-flight cap: latencies include the generator's delay"
)


def test_a_generator_limited_cell_is_said_in_a_load_line_and_every_verdict_on_it(tmp_path):
    """A cell whose run.json has a generator_limited failure got 'beyond run-to-run
    noise' verdicts with no word that its latencies include the load generator's delay."""
    import json

    from harness.report import ReportOptions, generate_report
    from tests.support.gate_runs import requests_frame, write_run

    cells = {
        "fcfs": requests_frame(seed=1, n=300),
        "sjf": requests_frame(seed=2, n=300, scale=0.5),
        "priority": requests_frame(seed=3, n=300, scale=2.0),
    }
    root = write_run(tmp_path / "run", cells)
    info = json.loads((root / "sjf" / "run.json").read_text())
    info.update(
        generator_limited=True, failures=[{"kind": "generator_limited", "message": LIMITED}]
    )
    (root / "sjf" / "run.json").write_text(json.dumps(info))
    paths = generate_report([root], root, ReportOptions(figures=False, resamples=50))
    md = paths["markdown"].read_text()
    assert f"LOAD (run/sjf): {LIMITED}" in md
    said = "sjf: generator-limited, latencies include the load generator's delay"
    summary = json.loads(paths["summary"].read_text())
    assert summary["verdicts"]
    for entry in summary["verdicts"].values():  # every one has sjf's value
        assert entry["generator_limited"] == ["sjf"] and said in entry["sentence"], entry
    for entry in summary["against_fcfs"]:
        involved = entry["policy"] == "sjf"
        assert entry["generator_limited"] == (["sjf"] if involved else [])
        assert (said in entry["sentence"]) is involved, entry["sentence"]
    assert "LOAD (run/fcfs)" not in md and "LOAD (run/priority)" not in md


def test_verdicts_over_different_requests_say_so_and_name_a_policy_without_a_value():
    """fcfs with 1000 ok requests and sjf with 960 ok and 40 rejected: 'sjf has the best
    p99 E2E' was over different requests, unsaid; a policy with no value was dropped."""
    n = 1000
    offsets = list(np.linspace(0, 100, n))
    rng = np.random.default_rng(5)
    rejected = ["rejected" if i % 25 == 0 else "ok" for i in range(n)]  # 40 of 1000
    no_short = ["error" if i % 2 else "ok" for i in range(n)]  # every 'short' failed
    policies = {
        "fcfs": _cell(_frame(list(2.0 + rng.uniform(0, 0.1, n)), offsets)),
        "sjf": _cell(_frame(list(1.0 + rng.uniform(0, 0.1, n)), offsets, status=rejected)),
        "priority": _cell(_frame(list(3.0 + rng.uniform(0, 0.1, n)), offsets, status=no_short)),
    }
    v = verdicts(policies, "short")
    tail = v["tail_e2e"]
    assert tail["winner"] == "sjf" and tail["runner_up"] == "fcfs"
    assert tail["requests"] == {
        "sjf": {"ok": 960, "total": 1000},
        "fcfs": {"ok": 1000, "total": 1000},
    }
    assert "(over different requests: sjf 960 of 1000 ok, fcfs 1000 of 1000)" in tail["sentence"]
    # goodput stands on every request (a failed one misses its SLOs): the same requests
    goodput = v["goodput"]
    assert goodput["requests"]["sjf"] == {"ok": 960, "total": 1000}
    assert "over different requests" not in goodput["sentence"]
    short = v["short_ttft"]
    assert short["no_value"] == {"priority": "no finished request of 'short'"}
    assert "(priority: no finished request of 'short')" in short["sentence"]
    assert short["requests"]["sjf"] == {"ok": 480, "total": 500}
    # the same requests on both sides: nothing to say
    same = verdicts({"fcfs": policies["fcfs"], "sjf": _cell(_frame([1.0] * n, offsets))}, None)
    assert "over different requests" not in same["tail_e2e"]["sentence"]
    assert same["tail_e2e"]["no_value"] == {}

    lines = {(c["policy"], c["class"]): c for c in against_fcfs(policies, "short", "long")}
    sjf = lines[("sjf", "long")]
    assert sjf["requests"] == {"sjf": {"ok": 480, "total": 500}, "fcfs": {"ok": 500, "total": 500}}
    assert "(over different requests: sjf 480 of 500 ok, fcfs 500 of 500)" in sjf["sentence"]
    # priority finished no 'short' request: named, not left out
    named = lines[("priority", "short")]
    assert named["value"] is None and not named["beyond_noise"]
    assert "priority: no finished request of 'short'" in named["sentence"], named["sentence"]


def _with_cuts(n_ok: int, n_cut: int, seconds: float) -> pl.DataFrame:
    """``n_ok`` finished requests of ``seconds`` E2E, then ``n_cut`` cut in flight."""
    n = n_ok + n_cut
    offsets = [float(i) for i in range(n)]
    return tables.load_requests(
        pl.LazyFrame(
            {
                "request_id": [f"r{i}" for i in range(n)],
                "class": ["long"] * n,
                "status": ["ok"] * n_ok + ["aborted"] * n_cut,
                "prompt_tokens": [10] * n,
                "output_tokens": [11] * n_ok + [3] * n_cut,
                "max_tokens": [20] * n,
                "schedule_offset_s": offsets,
                "scheduled_at": [1.7e9 + o for o in offsets],
                "ttft_s": [0.1] * n,
                "tpot_s": [0.01] * n,
                "e2e_s": [seconds] * n_ok + [None] * n_cut,
                "cut_at": [None] * n_ok + [1.7e9 + o + 60 for o in offsets[n_ok:]],
            }
        ),
        {},
    )


def test_cut_counts_beyond_their_noise_name_no_winner():
    # fcfs: 18 of 52 finished (34 cut); sjf: 45 finished (7 cut), each slower: the
    # survivors' p99 would crown fcfs, over different work
    policies = {"fcfs": _cell(_with_cuts(18, 34, 5.0)), "sjf": _cell(_with_cuts(45, 7, 9.0))}
    tail = verdicts(policies, None)["tail_e2e"]
    assert tail["cut_differs"] and tail["winner"] is None and not tail["beyond_noise"]
    assert tail["requests"]["fcfs"]["cut"] == 34 and tail["requests"]["sjf"]["cut"] == 7
    assert tail["sentence"].startswith("no verdict on p99 E2E")
    assert "fcfs 34 of 52" in tail["sentence"] and "sjf 7 of 52" in tail["sentence"]


def test_cut_counts_within_their_noise_keep_the_verdict_and_name_them():
    policies = {"fcfs": _cell(_with_cuts(45, 7, 5.0)), "sjf": _cell(_with_cuts(44, 8, 9.0))}
    tail = verdicts(policies, None)["tail_e2e"]
    assert not tail.get("cut_differs") and tail["winner"] == "fcfs"
    assert "fcfs 7 of 52, sjf 8 of 52 cut in flight: censored" in tail["sentence"]
