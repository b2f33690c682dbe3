"""Distributed runs: a Locust master and worker processes with their own records
directories and clocks shifted by ``SCHEDSCOPE_TEST_CLOCK_OFFSET_S``.

The master's records directory must be the whole run (rows forwarded over Locust's
messages, harness/loadgen/forward.py), its instants on the master's clock (the
estimated offsets, harness/loadgen/clock.py), equal row for row to the same schedule
run by one process; a worker killed mid-run is reported with its missing count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.loadgen.clock import TEST_OFFSET_ENV, Probe, best, clock_warnings, to_master_clock
from harness.loadgen.merge import merge_records
from harness.report.inputs import _load_notes
from harness.run.cell_result import CellResult
from harness.run.collect import client_records
from harness.run.loadgen import distribution_args, worker_line
from harness.run.matrix import Cell
from harness.serve.local_server import CliServer
from tests.harness.loadgen.test_loadgen import LOCUST, PROFILE_FILE, ROOT, run_locust
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow]

#: Columns that depend on the worker, on timing or on the server's state, not on the schedule.
TIMING = {
    "worker",
    "run_id",
    "scheduled_at",
    "sent_at",
    "first_token_at",
    "last_token_at",
    "ttft_s",
    "ttft_from_sent_s",
    "tpot_s",
    "e2e_s",
    "e2e_from_sent_s",
    "max_itl_s",
    "itl_s",
    "send_lag_s",
    "in_flight_capped",
    "retried",
    # the server's prefix cache: the second run's prompts repeat the first's, so they hit
    "cached_tokens",
}


def start(args: list[str], log: Path, offset: float | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(TEST_OFFSET_ENV, None)
    if offset is not None:
        env[TEST_OFFSET_ENV] = str(offset)
    cmd = [LOCUST, "-f", str(PROFILE_FILE), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def distributed(url: str, tmp: Path, offsets: list[float], kill: int | None = None):
    """A master and one worker per offset; ``kill``: SIGKILL that worker once it has
    sent rows. Returns (master's exit code, its output, the workers' pids in offset
    order: the master numbers its workers in its own order)."""
    port = free_port()
    master = start(
        [
            "--master",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(port),
            "--expect-workers",
            str(len(offsets)),
            "--host",
            url,
            "--headless",
            "--only-summary",
            "--records-dir",
            str(tmp / "master"),
            "--grace",
            "10",
        ],
        tmp / "master.log",
    )
    workers = [
        start(
            [
                "--worker",
                "--master-host",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--records-dir",
                str(tmp / f"worker{i}"),
            ],
            tmp / f"worker{i}.log",
            offset,
        )
        for i, offset in enumerate(offsets)
    ]
    try:
        if kill is not None:
            deadline = time.monotonic() + 60
            # kill once the victim wrote local rows: it is mid-run
            while time.monotonic() < deadline:
                local = list((tmp / f"worker{kill}").glob("worker-*/client-*.jsonl"))
                if local and local[0].read_text().count("\n") >= 5:
                    break
                time.sleep(0.05)
            os.kill(workers[kill].pid, signal.SIGKILL)
        code = master.wait(120)
    finally:
        stop_all([master, *workers])
    return code, (tmp / "master.log").read_text(), [p.pid for p in workers]


def stop_all(processes: list[subprocess.Popen]) -> None:
    """Kill those of ``processes`` (started by the test) still running, and reap all."""
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def schedscope_worker(
    port: int, tmp: Path, i: int, cwd: Path, env: dict[str, str]
) -> subprocess.Popen:
    """`schedscope worker --once` for the master on ``port``, run in ``cwd``: its
    records in ``tmp/w<i>``, its output in ``tmp/w<i>.log``."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "harness.cli", "worker", "--master-host", "127.0.0.1",
            "--master-port", str(port), "--once", "--records-dir", str(tmp / f"w{i}"),
        ],
        cwd=cwd, env=env, stdout=open(tmp / f"w{i}.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_clock_estimate_bounds_the_true_offset():
    # 30 ms out, 10 ms back, 1 ms on the worker, worker 0.25 s ahead
    p = Probe(t0=100.0, t1=100.03 + 0.25, t2=100.031 + 0.25, t3=100.041)
    assert abs(p.offset_s - (0.25 + 0.01)) < 1e-9  # the asymmetry's error ...
    assert abs(p.uncertainty_s - 0.02) < 1e-9  # ... lies within the uncertainty
    assert best([p, Probe(0.0, 0.25, 0.25, 0.002)])["uncertainty_s"] == 0.001


@given(
    st.floats(-5, 5),
    st.floats(0, 0.1),
    st.floats(0, 0.1),
    st.floats(0, 0.01),
)
def test_true_offset_lies_within_the_uncertainty(offset, out, back, held):
    t0 = 1000.0
    p = Probe(t0, t0 + out + offset, t0 + out + held + offset, t0 + out + held + back)
    assert abs(p.offset_s - offset) <= p.uncertainty_s + 1e-9


def test_to_master_clock_shifts_instants_only():
    row = {"scheduled_at": 10.0, "sent_at": None, "ttft_s": 0.5, "last_token_at": 11.0}
    assert to_master_clock(row, 0.25) == {
        "scheduled_at": 9.75,
        "sent_at": None,
        "ttft_s": 0.5,
        "last_token_at": 10.75,
    }


def test_master_gets_every_row_on_its_clock(tmp_path):
    offsets = [0.25, -0.4]
    with CliServer(["--executor", "sim"]) as server:
        run_locust(server.url, tmp_path / "one")
        code, out, pids = distributed(server.url, tmp_path, offsets)
    assert code == 0, out
    one = merge_records(tmp_path / "one")
    assert one["workers"] == 1 and not one["lost_workers"] and not one["clock"]
    two = merge_records(tmp_path / "master")
    assert two["workers"] == 2 and not two["lost_workers"], two
    # The estimated offsets are the injected ones (loopback: within a few ms).
    index = {w["pid"]: w["worker"] for w in two["worker_summaries"]}
    for pid, offset in zip(pids, offsets, strict=True):
        est = two["clock"][str(index[pid])]
        assert abs(est["offset_s"] - offset) < 0.005, two["clock"]
        assert est["uncertainty_s"] < 0.005
    # The workers' own directories hold only their local copies, on their clocks.
    for i in range(2):
        assert not list((tmp_path / f"worker{i}").glob("client-*.jsonl"))
        assert list((tmp_path / f"worker{i}").glob("worker-*/client-*.jsonl"))
    frames = [
        pl.read_parquet(tmp_path / d / "requests.parquet").sort("request_id")
        for d in ("one", "master")
    ]
    # Every row a worker wrote locally reached the master.
    local = sum(
        len(path.read_text().splitlines())
        for path in tmp_path.glob("worker*/worker-*/client-*.jsonl")
    )
    assert local == frames[1].height == two["rows"]
    keep = [c for c in frames[0].columns if c not in TIMING]
    opened = [f.filter(pl.col("phase_kind") == "open") for f in frames]
    assert opened[0].select(keep).equals(opened[1].select(keep))
    # closed loops: as many requests as each loop's second allowed (timing), ids unique
    closed = [f.filter(pl.col("phase_kind") == "closed") for f in frames]
    assert closed[1]["request_id"].is_unique().all() and set(closed[1]["worker"]) == {0, 1}
    assert two["status_counts"] == {"ok": frames[1].height}
    # On the master's clock: every open-loop row leaves at run start + its offset (within
    # a few ms), which a worker 0.25 s or 0.4 s off would miss uncorrected.
    start = two["run_start_unix"]
    drift = (opened[1]["scheduled_at"] - start - opened[1]["schedule_offset_s"]).abs()
    assert drift.max() < 0.01, drift.max()
    starts = [w["run_start_unix"] for w in two["worker_summaries"]]
    assert max(starts) - min(starts) < 0.01


def test_a_worker_killed_mid_run_is_reported_with_its_missing_count(tmp_path):
    with CliServer(["--executor", "sim"]) as server:
        code, out, _pids = distributed(server.url, tmp_path, [0.1, -0.1], kill=1)
    assert code == 1, out
    summary = merge_records(tmp_path / "master")
    [lost] = summary["lost_workers"]
    victim, survivor = lost["worker"], 1 - lost["worker"]
    frame = pl.read_parquet(tmp_path / "master" / "requests.parquet")
    got = set(frame.filter(pl.col("worker") == victim)["request_id"])
    assert lost["missing_open"] > 0 and set(lost["missing_request_ids"]).isdisjoint(got)
    assert lost["missing_open"] + len(got & set(_open_ids(victim, 2))) == lost["num_open_requests"]
    assert summary["missing_open"] == lost["missing_open"]
    assert (
        f"WORKER LOST: worker {victim} sent no summary (it died or lost the master): "
        f"{lost['missing_open']} of its {lost['num_open_requests']} scheduled" in out
    ), out
    # worker 0 finished its share: all its rows are there
    assert {w["worker"] for w in summary["worker_summaries"]} == {survivor}
    assert (
        frame.filter(pl.col("worker") == survivor).height
        == (summary["worker_summaries"][0]["rows"])
    )
    # The cell of a schedscope run says so (a worker_lost failure), and so does the report.
    result = CellResult(Cell("c", "fcfs", None, 1.0, {}), tmp_path, "serve")
    info: dict = {}
    client_records(result, tmp_path / "master", info)
    [failure] = [f for f in result.failures if f["kind"] == "worker_lost"]
    assert f"{lost['missing_open']} of its {lost['num_open_requests']}" in failure["message"]
    notes = _load_notes({"failures": result.failures, "loadgen": info["loadgen"]})
    # (a generator-limited load, on a busy machine, is a LOAD line of its own)
    assert [n for n in notes if not n.startswith("generator-limited:")] == [failure["message"]]


def _open_ids(worker: int, workers: int) -> list[str]:
    from harness.loadgen.split import share
    from harness.profiles import build_plan, load_profile

    plan = build_plan(load_profile(PROFILE_FILE))
    return [s.request_id for s in share(plan, worker, workers).open_requests]


def test_distribution_args():
    assert distribution_args(1, None, 5557, 60) == []
    assert distribution_args(3, None, 5557, 60) == [
        "--master-bind-host",
        "127.0.0.1",
        "--processes",
        "3",
    ]
    assert distribution_args(1, 2, 6000, 60.4, "127.0.0.1") == [
        "--master",
        "--master-bind-host",
        "127.0.0.1",
        "--master-bind-port",
        "6000",
        "--expect-workers",
        "2",
        "--expect-workers-max-wait",
        "60",
    ]
    for bad in ((0, None), (1, 0), (2, 2)):
        with pytest.raises(ValueError):
            distribution_args(*bad, 5557, 60)
    assert worker_line("gen-1") == "schedscope worker --master-host gen-1"
    assert worker_line("gen-1", 6000) == "schedscope worker --master-host gen-1 --master-port 6000"


def test_clock_warnings_name_the_uncertain_workers():
    clock = {
        "0": {"offset_s": 0.2, "uncertainty_s": 0.001},
        "1": {"offset_s": -1.0, "uncertainty_s": 0.02},
    }
    [line] = clock_warnings(clock)
    assert line.startswith("worker 1: clock offset -1000.0 ms known only to ±20.0 ms")


def run_with_remote_workers(tmp_path, mode: list[str], offsets: tuple[float, ...]):
    """`schedscope run` (sim executor, served) as the master with ``mode``'s flags, and
    one `schedscope worker` per clock offset; returns (exit code, output, run dir)."""
    port = free_port()
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop(TEST_OFFSET_ENV, None)
    run = subprocess.Popen(
        [
            sys.executable, "-m", "harness.cli", "run", "--executor", "sim", "--policy", "fcfs",
            "--duration-scale", "0.03", "--grace", "10", "--no-report", "--out", str(out),
            *mode, "--master-port", str(port),
            "--master-bind-host", "127.0.0.1", "--workers-wait", "120",
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    workers = []
    try:
        for i, offset in enumerate(offsets):
            wenv = {**env, TEST_OFFSET_ENV: str(offset)}
            workers.append(schedscope_worker(port, tmp_path, i, ROOT, wenv))
        output, _ = run.communicate(timeout=400)
    finally:
        stop_all([run, *workers])
    return run.returncode, output, out


def test_schedscope_run_expect_workers_with_remote_workers(tmp_path):
    """`schedscope run --expect-workers 2` waits for two `schedscope worker`s (each its
    own records directory and clock): the cell's requests.parquet has both workers' rows,
    run.json their offsets."""
    code, output, out = run_with_remote_workers(tmp_path, ["--expect-workers", "2"], (0.3, -0.2))
    assert code == 0, output
    assert "start each with: schedscope worker --master-host" in output
    info = json.loads((out / "fcfs" / "run.json").read_text())
    clock = info["loadgen"]["clock"]
    assert sorted(round(c["offset_s"], 2) for c in clock.values()) == [-0.2, 0.3], clock
    assert not info["loadgen"]["lost_workers"]
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet")
    assert set(frame["worker"]) == {0, 1} and frame["request_id"].is_unique().all()
    assert frame.height == info["loadgen"]["rows"]


def test_remote_workers_alone_waits_for_one_worker_started_elsewhere(tmp_path):
    """`schedscope run --remote-workers` (Locust's master mode, the count left out) waits
    for one `schedscope worker`, which sends every row of the cell."""
    code, output, out = run_with_remote_workers(tmp_path, ["--remote-workers"], (0.0,))
    assert code == 0, output
    assert "each cell waits for 1 worker(s)" in output
    info = json.loads((out / "fcfs" / "run.json").read_text())
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet")
    assert set(frame["worker"]) == {0} and frame.height == info["loadgen"]["rows"] > 0


def test_the_report_notes_uncertain_clocks():
    clock = {"0": {"offset_s": 0.01, "uncertainty_s": 0.05}}
    [note] = _load_notes({"loadgen": {"clock": clock}})
    assert note.startswith("worker 0: clock offset +10.0 ms known only to ±50.0 ms")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--workers", "2", "--expect-workers", "2"], "exclude each other"),
        (["--workers", "2", "--remote-workers"], "exclude each other"),
        (["--workers", "0"], "--workers 0: need at least 1"),
        (["--expect-workers", "0"], "--expect-workers 0: need at least 1"),
    ],
)
def test_bad_worker_counts_are_usage_errors(flags, says):
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--simulate", *flags],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and says in done.stdout + done.stderr, done.stderr


def test_schedscope_run_workers_spreads_the_cell_over_local_processes(tmp_path):
    """`schedscope run --workers 2`: Locust's --processes 2, the cell's rows from both."""
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "harness.cli", "run", "--executor", "sim", "--policy", "fcfs",
            "--duration-scale", "0.03", "--grace", "10", "--no-report", "--out", str(out),
            "--workers", "2",
        ],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    info = json.loads((out / "fcfs" / "run.json").read_text())
    assert info["locust_command"][-2:] == ["--processes", "2"]
    assert info["loadgen"]["workers"] == 2 and set(info["loadgen"]["clock"]) == {"0", "1"}
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet")
    assert set(frame["worker"]) == {0, 1} and frame["request_id"].is_unique().all()
    assert frame.height == info["loadgen"]["rows"] and not info["loadgen"]["lost_workers"]
