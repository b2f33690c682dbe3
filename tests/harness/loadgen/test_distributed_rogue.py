"""A real Locust master and worker, and a rogue peer on the master's port.

The rogue is a ZMQ DEALER speaking Locust's msgpack protocol
(``locust.rpc.protocol.Message``): a forged end of the run, rows of another run, a
clock pong, a message that lies about its sender, Locust messages of the wrong shape,
and frames that are not Locust's at all. The master must keep every record of its real
worker and none of the rogue's, exit 0 (its worker sent everything), and name the rogue
in its log (harness/loadgen/master_guard.py, intake.py). Also: a master that was told to
expect more workers than came exits 1 and records it (workers.json, the merged
summary's ``workers_expected``/``workers_started``), and a master with a worker token
gives no share to a peer without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import msgpack
import polars as pl
import pytest
import zmq
from locust import __version__ as LOCUST_VERSION
from locust.rpc.protocol import Message

from harness.loadgen.clock import TEST_OFFSET_ENV
from harness.loadgen.master_guard import TOKEN_ENV
from harness.loadgen.merge import merge_records
from harness.serve.local_server import CliServer
from tests.harness.loadgen.test_distributed import stop_all
from tests.harness.loadgen.test_loadgen import LOCUST, PROFILE_FILE, ROOT, plan_open_ids
from tests.support.ports import free_port
from tests.support.waiting import wait_for

KEY = "sk-test-4f9c2a7d"
ROGUE = "rogue-peer"

pytestmark = [pytest.mark.slow]


def locust(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for name in (TEST_OFFSET_ENV, TOKEN_ENV, "LOCUST_API_KEY"):
        if name not in (env or {}):
            full.pop(name, None)
    return subprocess.Popen(
        [LOCUST, "-f", str(PROFILE_FILE), *args],
        cwd=ROOT,
        env=full,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def master(port: int, tmp: Path, expect: int, *extra: str, env=None) -> subprocess.Popen:
    return locust(
        [
            "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
            "--expect-workers", str(expect), "--host", URL[0], "--headless", "--only-summary",
            "--records-dir", str(tmp / "master"), "--grace", "10", *extra,
        ],
        tmp / "master.log",
        env,
    )  # fmt: skip


def worker(port: int, tmp: Path, env=None) -> subprocess.Popen:
    return locust(
        [
            "--worker", "--master-host", "127.0.0.1", "--master-port", str(port),
            "--records-dir", str(tmp / "worker"),
        ],
        tmp / "worker.log",
        env,
    )  # fmt: skip


#: The target's URL, set by the module's server fixture.
URL: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def target():
    with CliServer(["--executor", "sim"]) as server:
        URL[:] = [server.url]
        yield


def rogue_socket(port: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, ROGUE.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def forged_rows(n: int = 16) -> list[dict]:
    from harness.loadgen.records import RECORD_COLUMNS

    rows = []
    for i in range(n):
        r = {c: None for c in RECORD_COLUMNS}
        r.update(
            request_id=f"<script>alert({i})</script>", run_id="other-run", status="ok",
            phase_kind="open", worker=0, in_flight_capped=False, retried=False, itl_s=[],
            scheduled_at=1.0, profile="locust_small", **{"class": "short_chat"},
        )  # fmt: skip
        rows.append(r)
    return rows


def test_a_rogue_peer_neither_ends_the_run_nor_adds_rows(tmp_path):
    port = free_port()
    processes = [
        master(port, tmp_path, 1, "--api-key", KEY),
        worker(port, tmp_path, {"LOCUST_API_KEY": KEY}),
    ]
    rogue = rogue_socket(port)
    try:
        # once the run is under way (the master has the worker's first rows) ...
        wait_for(
            lambda: list((tmp_path / "master").glob("client-*.jsonl")),
            "the master's client records",
            timeout_s=90,
        )
        for frame in (
            msgpack.packb(5),  # decodes, but is no (type, data, node_id)
            b"\xc1",  # a byte msgpack never uses
            Message("schedscope_done", {"worker": 0}, ROGUE).serialize(),
            Message(
                "schedscope_rows", {"worker": 0, "pid": 1, "rows": forged_rows()}, ROGUE
            ).serialize(),
            Message(
                "schedscope_pong",
                {"worker": 0, "seq": 0, "t0": 0.0, "t1": 3600.0, "t2": 3600.5},
                ROGUE,
            ).serialize(),  # fmt: skip
            Message("schedscope_done", {"worker": 0}, "vm_someone_else").serialize(),
            Message("client_ready", 5, ROGUE).serialize(),  # Locust's handler raises
            Message("exception", None, ROGUE).serialize(),
            # registered as a worker is, mid-run: it would join Locust's dispatch, and a
            # report Locust cannot read made the master exit 2
            Message("client_ready", LOCUST_VERSION, ROGUE).serialize(),
            Message("stats", {}, ROGUE).serialize(),
            Message("heartbeat", {"state": "running"}, ROGUE).serialize(),
        ):
            rogue.send(frame)
        code = processes[0].wait(120)
    finally:
        rogue.close()
        stop_all(processes)
    out = (tmp_path / "master.log").read_text()
    assert code == 0, out
    summary = merge_records(tmp_path / "master")
    frame = pl.read_parquet(tmp_path / "master" / "requests.parquet")
    # every scheduled open-loop request has its row, the closed loop's too, none forged
    opened = frame.filter(pl.col("phase_kind") == "open")
    assert sorted(opened["request_id"]) == sorted(plan_open_ids()), out
    assert frame.filter(pl.col("phase_kind") == "closed").height > 0
    assert not frame["request_id"].str.contains("<").any() and frame["request_id"].is_unique().all()
    assert set(frame["run_id"]) == {summary["run_id"]} and set(frame["status"]) == {"ok"}
    [mine] = summary["worker_summaries"]
    assert mine["rows"] == frame.height and mine["rows_refused"] == 0
    assert not summary["lost_workers"] and not summary["failed_workers"]
    assert (summary["workers_expected"], summary["workers_started"]) == (1, 1)
    assert summary["refused_messages"] >= 7 and summary["rows_refused"] == 0
    facts = json.loads((tmp_path / "master" / "workers.json").read_text())
    assert facts["refused_by_sender"][ROGUE] >= 5, facts
    assert f"from client '{ROGUE}'" in out and "not a Locust message" in out, out
    # the worker had its own key (the master sent none); none is in the master's files
    assert mine["options"]["api_key"] == "***"
    for path in (tmp_path / "master").rglob("*"):
        assert KEY.encode() not in path.read_bytes(), path


def test_fewer_workers_than_expected_exit_1_and_are_recorded(tmp_path):
    port = free_port()
    processes = [
        master(port, tmp_path, 2, "--expect-workers-max-wait", "4"),
        worker(port, tmp_path),
    ]
    try:
        code = processes[0].wait(90)
    finally:
        stop_all(processes)
    out = (tmp_path / "master.log").read_text()
    assert code == 1, out
    assert "Gave up waiting for workers" in out
    # Locust gave up before the test started: one came, none was given a share
    facts = json.loads((tmp_path / "master" / "workers.json").read_text())
    assert (facts["expected"], facts["connected"], facts["started"]) == (2, 1, 0), facts
    summary = merge_records(tmp_path / "master")
    assert (summary["workers_expected"], summary["workers_started"]) == (2, 0)


def test_with_a_worker_token_a_peer_without_it_gets_no_share(tmp_path):
    port = free_port()
    token = {TOKEN_ENV: "t0ken-for-this-test"}
    processes = [master(port, tmp_path, 2, env=token), worker(port, tmp_path, token)]
    rogue = rogue_socket(port)
    try:
        wait_for(
            lambda: "1 workers connected" in (tmp_path / "master.log").read_text(),
            "1 worker connected",
            timeout_s=90,
        )
        # the rogue registers as Locust's workers do, and claims the wrong token
        rogue.send(Message("client_ready", LOCUST_VERSION, ROGUE).serialize())
        rogue.send(Message("schedscope_hello", {"token": "guess"}, ROGUE).serialize())
        received = []
        deadline = time.monotonic() + 120
        while processes[0].poll() is None and time.monotonic() < deadline:
            if rogue.poll(100):
                received.append(Message.unserialize(rogue.recv()).type)
        code = processes[0].wait(10)
    finally:
        rogue.close()
        stop_all(processes)
    out = (tmp_path / "master.log").read_text()
    assert code == 1, out  # two expected, one started
    assert f"client {ROGUE} did not present the worker token" in out, out
    assert "WORKERS MISSING: 1 of the 2 expected" in out, out
    assert "schedscope_split" not in received and "schedscope_ping" not in received, received
    summary = merge_records(tmp_path / "master")
    assert (summary["workers_expected"], summary["workers_started"]) == (2, 1)
    facts = json.loads((tmp_path / "master" / "workers.json").read_text())
    assert facts["excluded_clients"] == [ROGUE] and facts["token_required"] is True
    frame = pl.read_parquet(tmp_path / "master" / "requests.parquet")
    opened = frame.filter(pl.col("phase_kind") == "open")
    assert sorted(opened["request_id"]) == sorted(plan_open_ids())
