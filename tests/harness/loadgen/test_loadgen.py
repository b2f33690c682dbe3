"""The load generator run by the real ``locust`` command against a live sim server.

Each test starts ``schedscope serve --executor sim`` on loopback (CliServer), runs a
few seconds of ``tests/data/locust_small.py`` with ``locust --headless`` as a
subprocess, merges the records and checks them against the schedule and the
server's own counters and records.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from harness.loadgen.merge import merge_records
from harness.loadgen.split import share
from harness.profiles import build_plan, load_profile
from harness.serve.local_server import CliServer
from tests.support.cost_model_file import constant_cost_model_file
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow]

ROOT = REPO
PROFILE_FILE = ROOT / "tests" / "data" / "locust_small.py"
LOCUST = str(Path(sys.executable).parent / "locust")


def run_locust(
    url: str,
    records: Path,
    *extra: str,
    timeout: float = 90,
    background: bool = False,
    failures: bool = False,
    profile: Path = PROFILE_FILE,
):
    """Locust exits 1 when any request failed (its --exit-code-on-error): pass
    ``failures=True`` where failures are the point."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        LOCUST,
        "-f",
        str(profile),
        "--host",
        url,
        "--headless",
        "--only-summary",
        "--records-dir",
        str(records),
        "--grace",
        "10",
        *extra,
    ]
    if background:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == (1 if failures else 0), done.stdout + done.stderr
    return done.stdout + done.stderr


def metric_sum(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    )


def plan_open_ids(duration_scale: float = 1.0, rate_scale: float = 1.0, path: Path = PROFILE_FILE):
    profile = load_profile(path).with_rate_scale(rate_scale)
    plan = build_plan(profile.with_duration_scale(duration_scale))
    return {s.request_id: s.scheduled_at for s in plan.open_loop_requests()}


def locust_table(out: str) -> dict[tuple[str, str], tuple[int, int]]:
    """Locust's printed statistics: (type, name) -> (requests, failures); the total is
    ("", "Aggregated")."""
    table = {}
    for m in re.finditer(r"^(\w*)\s+(\S[^|]*?)\s+(\d+)\s+(\d+)\([\d.]+%\)\s+\|", out, re.M):
        table[(m.group(1), m.group(2))] = (int(m.group(3)), int(m.group(4)))
    assert ("", "Aggregated") in table, out
    return table


def check_cut_run(out: str, records: Path, open_ids: dict[str, float], run_time: float):
    """A run that -t cut: it said so at the start (the count from the plan), every scheduled
    open-loop request has its row, nothing failed, and the end's counts are the rows'."""
    summary = merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    beyond = sum(1 for t in open_ids.values() if t >= run_time)
    assert 0 < beyond < len(open_ids)
    assert (
        f"-t {run_time:g}s is shorter than the" in out
        and f"{beyond} of its {len(open_ids)} scheduled open-loop requests" in out
    ), out
    opened = frame.filter(pl.col("phase_kind") == "open")
    assert set(opened["request_id"]) == set(open_ids)
    assert set(frame["status"]) <= {"ok", "aborted"}, summary["status_counts"]
    unsent = frame.filter(pl.col("sent_at").is_null())
    assert unsent.height >= beyond and (unsent["status"] == "aborted").all()
    assert (unsent["error"] == "not sent: the run stopped before its scheduled instant").all()
    cut = frame.filter(pl.col("error") == "in flight when the run stopped")
    assert (cut["status"] == "aborted").all() and cut["sent_at"].null_count() == 0
    assert summary["cut_in_flight"] == cut.height and summary["not_sent"] == unsent.height
    assert (
        f"{cut.height} request(s) cut in flight (Locust's CUT requests) and "
        f"{unsent.height} scheduled request(s) not sent" in out
    ), out
    table = locust_table(out)
    assert table[("", "Aggregated")][1] == 0, out  # no failure
    assert sum(n for (kind, _), (n, _f) in table.items() if kind == "CUT") == cut.height
    assert all(f == 0 for (kind, _), (_n, f) in table.items() if kind == "CUT")
    return summary, frame, cut


def test_shares_partition_the_plan():
    plan = build_plan(load_profile(PROFILE_FILE))
    ids = [s.request_id for s in plan.open_loop_requests()]
    for w in (1, 2, 3, 5):
        shares = [share(plan, i, w) for i in range(w)]
        got = sorted(s.request_id for sh in shares for s in sh.open_requests)
        assert got == sorted(ids)
        loops = sorted((lp.phase, lp.loop) for sh in shares for lp in sh.closed_loops)
        assert loops == [(1, 0), (1, 1), (1, 2)]


def test_records_complete_and_joined_with_the_server(tmp_path):
    engine_records = tmp_path / "engine.parquet"
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim", "--record-requests", str(engine_records)]) as server:
        # A 200 ms lag limit: with ~40 open-loop requests the p99 lag is their maximum, and
        # one late gevent timer on a loaded machine must not flag this run (flagging has
        # its own test below).
        out = run_locust(server.url, records, "--lag-limit-ms", "200")
        successes = metric_sum(server.url, "vllm:request_success_total")
    summary = merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    # Every scheduled open-loop request has exactly one row, at its scheduled instant.
    open_rows = frame.filter(pl.col("phase_kind") == "open")
    expected = plan_open_ids()
    assert (
        dict(zip(open_rows["request_id"], open_rows["schedule_offset_s"], strict=True)) == expected
    )
    assert frame.filter(pl.col("phase_kind") == "closed").height > 0
    assert summary["status_counts"] == {"ok": frame.height}
    # The server's own counter: every row plus the one probe request.
    assert successes == frame.height + summary["probe_requests"]
    assert "ttft short_chat" in out and "e2e long_gen" in out
    # Exact lengths on the server; latencies from scheduled_at.
    assert (frame["server_prompt_tokens"] == frame["prompt_tokens"]).all()
    assert (frame["output_tokens"] == frame["max_tokens"]).all()
    assert set(frame["prompt_method"]) == {"token_ids"}
    f = frame.with_columns(
        (pl.col("first_token_at") - pl.col("scheduled_at") - pl.col("ttft_s")).abs().alias("d1"),
        (pl.col("last_token_at") - pl.col("scheduled_at") - pl.col("e2e_s")).abs().alias("d2"),
        (pl.col("ttft_s") - pl.col("ttft_from_sent_s") - pl.col("send_lag_s")).abs().alias("d3"),
        pl.col("itl_s").list.len().alias("n_itl"),
    )
    assert f["d1"].max() < 1e-9 and f["d2"].max() < 1e-9 and f["d3"].max() < 1e-9
    assert (f["n_itl"] == f["output_tokens"] - 1).all()
    # Rows join the engine's records by request id, and the clocks agree.
    engine = pl.read_parquet(engine_records)
    joined = frame.join(
        engine.select("request_id", pl.col("scheduled_at").alias("arrival")),
        on="request_id",
        how="inner",
    )
    assert joined.height == frame.height
    epoch = summary["server_clock_epoch_unix"]
    skew = joined["arrival"] + epoch - joined["sent_at"]
    assert skew.min() >= -0.005 and skew.max() < 0.5
    assert not summary["generator_limited"]


def test_two_processes_send_the_same_schedule(tmp_path):
    with CliServer(["--executor", "sim"]) as server:
        run_locust(server.url, tmp_path / "one")
        run_locust(server.url, tmp_path / "two", "--processes", "2")
    one, two = merge_records(tmp_path / "one"), merge_records(tmp_path / "two")
    assert two["workers"] == 2
    frames = [pl.read_parquet(tmp_path / d / "requests.parquet") for d in ("one", "two")]
    opens = [
        f.filter(pl.col("phase_kind") == "open")
        .select("request_id", "schedule_offset_s")
        .sort("request_id")
        for f in frames
    ]
    assert opens[0].equals(opens[1])
    assert set(frames[1]["worker"]) == {0, 1}
    # request i went to worker i mod 2
    o = frames[1].filter(pl.col("phase_kind") == "open")
    idx = o["request_id"].str.slice(-7).cast(pl.Int64)
    assert ((idx % 2) == o["worker"]).all()
    # closed loops: 3 users split 2 + 1, ids never twice
    c = frames[1].filter(pl.col("phase_kind") == "closed")
    assert c["request_id"].is_unique().all() and set(c["worker"]) == {0, 1}
    assert one["status_counts"] == {"ok": frames[0].height}
    assert two["status_counts"] == {"ok": frames[1].height}


def test_generator_limited_run_is_flagged(tmp_path):
    # 2000 req/s for 0.5 s through at most 4 requests in flight: the generator cannot.
    # 0.5 ms steps, not the built-in model's: the ~1,000 requests must still drain
    # through 4 slots within --grace on a loaded machine (~5 s here, was ~15 s).
    cost = constant_cost_model_file(tmp_path, 0.0005)
    with CliServer(["--executor", "sim", "--cost-model", cost]) as server:
        out = run_locust(
            server.url,
            tmp_path / "rec",
            "--rate-scale",
            "100",
            "--duration-scale",
            "0.25",
            "--max-in-flight",
            "4",
        )
    summary = merge_records(tmp_path / "rec")
    assert summary["generator_limited"] is True
    assert summary["in_flight_capped"] > 0 and summary["send_lag_p99_s"] > 0.010
    assert "GENERATOR-LIMITED" in out
    frame = pl.read_parquet(tmp_path / "rec" / "requests.parquet")
    assert set(frame.filter(pl.col("phase_kind") == "open")["request_id"]) == set(
        plan_open_ids(0.25, 100)
    )
    capped = frame.filter(pl.col("in_flight_capped"))
    # Latency from the schedule includes the wait; from the send it does not.
    assert (capped["ttft_s"] > capped["ttft_from_sent_s"]).all()


def test_429s_are_rejected_rows(tmp_path):
    cost = constant_cost_model_file(tmp_path, 0.01)
    args = ["--executor", "sim", "--cost-model", cost, "--max-num-seqs", "1", "--max-waiting", "1"]
    with CliServer(args) as server:
        run_locust(server.url, tmp_path / "rec", "--duration-scale", "0.5", failures=True)
        rejections = metric_sum(server.url, "vllm:admission_rejections_total")
        successes = metric_sum(server.url, "vllm:request_success_total")
    summary = merge_records(tmp_path / "rec")
    frame = pl.read_parquet(tmp_path / "rec" / "requests.parquet")
    rejected = frame.filter(pl.col("status") == "rejected")
    assert rejected.height > 0 and (rejected["http_status"] == 429).all()
    assert rejected["error"].null_count() == 0
    assert rejected.height == rejections
    assert summary["status_counts"].get("ok", 0) + summary["probe_requests"] == successes
    assert set(frame.filter(pl.col("phase_kind") == "open")["request_id"]) == set(
        plan_open_ids(0.5)
    )


def test_vllms_admission_cap_503s_are_rejected_rows(tmp_path):
    """--max-num-queued-reqs (vLLM 0.32's cap, in the bundled engine): beyond it a 503,
    read as a refusal (``rejected``) and counted under vLLM's metric, as vLLM counts it."""
    cost = constant_cost_model_file(tmp_path, 0.01)
    args = ["--executor", "sim", "--cost-model", cost, "--max-num-seqs", "1"]
    with CliServer([*args, "--max-num-queued-reqs", "2"]) as server:
        run_locust(server.url, tmp_path / "rec", "--duration-scale", "0.5", failures=True)
        rejections = metric_sum(server.url, "vllm:admission_rejections_total")
    merge_records(tmp_path / "rec")
    frame = pl.read_parquet(tmp_path / "rec" / "requests.parquet")
    rejected = frame.filter(pl.col("status") == "rejected")
    assert rejected.height > 0 and (rejected["http_status"] == 503).all()
    assert rejected["error"].str.contains("max-num-queued-reqs").all()
    assert rejected.height == rejections
    assert frame.filter(pl.col("status") == "error").height == 0


def test_server_shutdown_mid_run_gives_error_and_aborted_rows(tmp_path):
    cost = constant_cost_model_file(tmp_path, 0.005)
    server = CliServer(["--executor", "sim", "--cost-model", cost, "--shutdown-timeout-s", "0.1"])
    with server:
        proc = run_locust(server.url, tmp_path / "rec", background=True)
        # Cut the server once a few requests have finished (not after a fixed sleep: a
        # slow machine may still be importing Locust then); most of the schedule is left.
        deadline = time.monotonic() + 60
        while metric_sum(server.url, "vllm:request_success_total") < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "no request finished"
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        server.wait(30)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out  # Locust's exit code when requests failed
    merge_records(tmp_path / "rec")
    frame = pl.read_parquet(tmp_path / "rec" / "requests.parquet")
    assert set(frame.filter(pl.col("phase_kind") == "open")["request_id"]) == set(plan_open_ids())
    statuses = set(frame["status"])
    assert "ok" in statuses and statuses & {"error", "aborted"}
    failed = frame.filter(pl.col("status") != "ok")
    assert failed["error"].null_count() == 0


def test_chat_prompts_sized_with_tokenize(tmp_path):
    with CliServer(["--executor", "sim"]) as server:
        run_locust(server.url, tmp_path / "rec", "--endpoint", "chat", "--duration-scale", "0.5")
    summary = merge_records(tmp_path / "rec")
    frame = pl.read_parquet(tmp_path / "rec" / "requests.parquet")
    assert summary["status_counts"] == {"ok": frame.height}
    assert set(frame["prompt_method"]) == {"tokenize"}
    assert (frame["server_prompt_tokens"] == frame["prompt_tokens"]).all()
    assert (frame["output_tokens"] == frame["max_tokens"]).all()


@pytest.mark.parametrize("mode", ["text"])
def test_completions_text_prompts_sized_with_tokenize(tmp_path, mode):
    with CliServer(["--executor", "sim"]) as server:
        run_locust(server.url, tmp_path / "rec", "--prompt-mode", mode, "--duration-scale", "0.5")
    merge_records(tmp_path / "rec")
    frame = pl.read_parquet(tmp_path / "rec" / "requests.parquet")
    assert set(frame["prompt_method"]) == {"tokenize"}
    assert (frame["server_prompt_tokens"] == frame["prompt_tokens"]).all()


def test_run_time_cut_in_flight_is_not_a_failure(tmp_path):
    # 0.1 s steps: every request is in flight for 0.2 s or more, a long one for 2 s or
    # more, so -t 3s cuts some in flight; the open phase runs 4 s of the 6 s schedule.
    cost = constant_cost_model_file(tmp_path, 0.1)
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim", "--cost-model", cost]) as server:
        out = run_locust(
            server.url, records, "--duration-scale", "2", "-t", "3s", "--lag-limit-ms", "1000"
        )  # exit code 0
    summary, frame, cut = check_cut_run(out, records, plan_open_ids(2.0), 3.0)
    assert cut.height > 0
    stopped = summary["worker_summaries"][0]["stopped_sending_unix"]
    assert (cut["sent_at"] <= stopped).all()
    assert "closed-loop phase(s) closed cut short or not run" in out


def test_stop_timeout_lets_in_flight_requests_finish(tmp_path):
    cost = constant_cost_model_file(tmp_path, 0.1)
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim", "--cost-model", cost]) as server:
        args = ["--duration-scale", "2", "-t", "3s", "--stop-timeout", "30"]
        out = run_locust(server.url, records, *args, "--lag-limit-ms", "1000")
        successes = metric_sum(server.url, "vllm:request_success_total")
    summary, frame, cut = check_cut_run(out, records, plan_open_ids(2.0), 3.0)
    assert cut.height == 0
    sent = frame.filter(pl.col("sent_at").is_not_null())
    assert (sent["status"] == "ok").all() and sent.height > 0
    assert successes == sent.height + summary["probe_requests"]
    # Requests were in flight when sending stopped, and finished within the stop timeout.
    stopped = summary["worker_summaries"][0]["stopped_sending_unix"]
    assert stopped is not None and (sent["last_token_at"] > stopped).sum() > 0
    assert (sent["sent_at"] <= stopped).all()


def test_two_processes_cut_by_run_time(tmp_path):
    cost = constant_cost_model_file(tmp_path, 0.1)
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim", "--cost-model", cost]) as server:
        args = ["--duration-scale", "2", "-t", "3s", "--processes", "2"]
        out = run_locust(server.url, records, *args, "--lag-limit-ms", "1000")
    summary, frame, _ = check_cut_run(out, records, plan_open_ids(2.0), 3.0)
    assert summary["workers"] == 2 and set(frame["worker"]) == {0, 1}
    assert "from 2 of 2 process(es)" in out


def test_the_mixed_profile_cut_by_run_time_exits_0(tmp_path):
    # The everyday profile under the built-in cost model: its requests (~160 tokens) are
    # in flight for seconds, so -t cuts them.
    path = ROOT / "loadprofiles" / "mixed.py"
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim"]) as server:
        out = run_locust(server.url, records, "-t", "3s", "--lag-limit-ms", "1000", profile=path)
    check_cut_run(out, records, plan_open_ids(path=path), 3.0)


def test_a_run_cut_by_run_time_in_which_no_request_completed_fails(tmp_path):
    # 5 s steps, as good as hung: nothing (not even the generator's probe) ends within
    # -t 3s. Cut requests are not failures, but a run that measured nothing is no pass.
    cost = constant_cost_model_file(tmp_path, 5.0)
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim", "--cost-model", cost]) as server:
        args = ["--duration-scale", "2", "-t", "3s", "--lag-limit-ms", "1000"]
        out = run_locust(server.url, records, *args, failures=True)
    summary = merge_records(records)
    assert summary["status_counts"].get("ok", 0) == 0, summary["status_counts"]
    assert "no request completed before the run stopped" in out
    assert all(f == 0 for (_kind, _), (_n, f) in locust_table(out).items()), out


def test_failures_still_fail_a_run_cut_by_run_time(tmp_path):
    # One running, one waiting: most arrivals get 429 (rejected rows, Locust failures).
    cost = constant_cost_model_file(tmp_path, 0.05)
    args = ["--executor", "sim", "--cost-model", cost, "--max-num-seqs", "1", "--max-waiting", "1"]
    records = tmp_path / "rec"
    with CliServer(args) as server:
        out = run_locust(server.url, records, "--duration-scale", "2", "-t", "3s", failures=True)
    merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    assert frame.filter(pl.col("status") == "rejected").height > 0
    assert frame.filter(pl.col("sent_at").is_null()).height > 0  # and the cut happened
    assert locust_table(out)[("", "Aggregated")][1] > 0


def test_requests_still_in_flight_when_grace_runs_out_are_failures(tmp_path):
    # 0.5 s steps: a long request (20+ tokens) takes 10 s or more, past the 0.75 s schedule
    # plus --grace 0 (the run stops about 5 s after the schedule's end).
    cost = constant_cost_model_file(tmp_path, 0.5)
    records = tmp_path / "rec"
    with CliServer(["--executor", "sim", "--cost-model", cost]) as server:
        args = ["--duration-scale", "0.25", "--grace", "0", "--lag-limit-ms", "1000"]
        out = run_locust(server.url, records, *args, failures=True)
    summary = merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    cut = frame.filter(pl.col("error") == "in flight when the run stopped")
    assert cut.height > 0 and summary["cut_in_flight"] == cut.height
    assert "counted as failures: --grace ran out" in out
    table = locust_table(out)
    assert table[("", "Aggregated")][1] >= cut.height
    assert not any(kind == "CUT" for kind, _ in table)
