"""What a distributed run's master accepts from the peers that reach its port.

Unit tests of the refusals (no Locust process): clock probes that answer no ping or
cannot have happened (harness/loadgen/clock.py), rows that are not this run's, not the
sender's share, received already or of another form (harness/loadgen/intake.py,
forward.Collector), the custom messages of a client that is not a numbered worker
(master_side.MasterSide), frames that are not Locust's or that lie about their sender
(harness/loadgen/master_guard.py), and the options sent to workers (no API key).
The real master, worker and rogue peer: tests/harness/loadgen/test_distributed_rogue.py.
"""

from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import msgpack
import pytest
from locust.rpc.protocol import Message
from locust.runners import MasterRunner

from harness.loadgen import clock
from harness.loadgen.forward import Collector
from harness.loadgen.intake import COLUMN_KINDS, Intake, row_problem, summary_problem
from harness.loadgen.locust_user import WORKERS_FILE, _State
from harness.loadgen.master_guard import HELLO, MasterGuard, decode, stats_problem
from harness.loadgen.master_side import MasterSide
from harness.loadgen.merge import SCHEMA, merge_records
from harness.loadgen.options import LoadgenOptions
from harness.loadgen.split import share
from harness.profiles import build_plan, load_profile
from tests.support.paths import REPO
from tests.support.record_rows import record_row

PROFILE_FILE = REPO / "tests" / "data" / "locust_small.py"
RUN = "locust_small-1"
KEY = "sk-secret-0123456789"


@pytest.fixture(scope="module")
def plan():
    return build_plan(load_profile(PROFILE_FILE))


def row(request_id: str, worker: int, run_id: str = RUN, **values) -> dict:
    return record_row(request_id, run_id=run_id, worker=worker, **values)


# -- clock probes -------------------------------------------------------------------------
def test_a_pong_that_cannot_have_happened_is_refused_not_clamped():
    sent = {0: 100.0}
    # the worker "held" the ping 3600 s within a 2 ms round trip: an uncertainty of
    # -1800 s, which max(0, ...) made 0 and the best of every probe
    forged = {"seq": 0, "t0": 100.0, "t1": 3700.0, "t2": 7300.0}
    with pytest.raises(clock.BadProbe, match="impossible"):
        clock.probe(sent, forged, 100.002)
    with pytest.raises(clock.BadProbe, match="impossible"):  # t2 before t1
        clock.probe(sent, {"seq": 0, "t0": 100.0, "t1": 100.0011, "t2": 100.001}, 100.002)
    assert sent == {0: 100.0}  # a refused pong answers nothing
    assert clock.Probe(100.0, 3700.0, 7300.0, 100.002).uncertainty_s < 0  # not hidden


@pytest.mark.parametrize(
    ("pong", "says"),
    [
        ({"seq": 1, "t0": 100.0, "t1": 100.001, "t2": 100.0011}, "no ping"),
        ({"seq": "0", "t0": 100.0, "t1": 100.001, "t2": 100.0011}, "no ping"),
        ({"seq": 0, "t0": 99.0, "t1": 100.001, "t2": 100.0011}, "is not that of ping 0"),
        ({"seq": 0, "t0": 100.0, "t1": math.nan, "t2": 100.0011}, "not finite"),
        ({"seq": 0, "t0": 100.0, "t1": math.inf, "t2": math.inf}, "not finite"),
        ({"seq": 0, "t0": 100.0, "t1": "x", "t2": 100.0011}, "not finite"),
        ({"seq": 0, "t0": 100.0, "t2": 100.0011}, "not finite"),
        ([0, 100.0], "not a mapping"),
    ],
)
def test_a_pong_for_no_ping_of_the_master_is_refused(pong, says):
    with pytest.raises(clock.BadProbe, match=says):
        clock.probe({0: 100.0}, pong, 100.002)


def test_a_good_pong_answers_its_ping_once():
    sent = {0: 100.0, 1: 100.5}
    pong = {"seq": 0, "t0": 100.0, "t1": 100.2505, "t2": 100.2506}
    p = clock.probe(sent, pong, 100.001)
    assert abs(p.offset_s - 0.25) < 1e-3 and 0 <= p.uncertainty_s < 1e-3
    assert sent == {1: 100.5}
    with pytest.raises(clock.BadProbe, match="no ping"):  # the same answer again
        clock.probe(sent, pong, 100.001)


# -- rows ---------------------------------------------------------------------------------
def test_the_intake_kinds_are_the_merge_schema():
    kinds = {"str": "String", "int": "Int64", "float": "Float64", "bool": "Boolean"}
    for column, kind in COLUMN_KINDS.items():
        want = "List(Float64)" if kind == "floats" else kinds[kind]
        assert str(SCHEMA[column]) == want, column


def test_each_request_id_belongs_to_one_worker_by_the_split(plan):
    intake = Intake(RUN, plan, 2)
    for w in (0, 1):
        for spec in share(plan, w, 2).open_requests:
            assert intake.owner(spec.request_id) == w
    closed = next(p for p in plan.phases if p.kind == "closed")
    for loop in share(plan, 1, 2).closed_loops:
        for m in range(3):
            spec = closed.request_at(loop.spec_index(m))
            assert intake.owner(spec.request_id) == 1
    prefix = f"locust_small-{plan.seed}-c{closed.index}-"
    assert intake.owner(f"{prefix}0000002") == (2 % closed.concurrency) % 2
    for foreign in (
        "<script>alert(1)</script>",
        f"{prefix}2",  # not the plan's spelling
        f"{prefix}00000002",
        f"locust_small-{plan.seed}-c0-0000001",  # phase 0 is open-loop
        f"locust_small-{plan.seed + 1}-0000001",  # another seed
        f"locust_small-{plan.seed}-9999999",  # beyond the open-loop schedule
    ):
        assert intake.owner(foreign) is None, foreign


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"worker": "0"}, "worker is not a int"),
        ({"worker": True}, "worker is not a int"),
        ({"prompt_tokens": 2**64}, "prompt_tokens is not a int"),
        ({"scheduled_at": math.nan}, "scheduled_at is not a float"),
        ({"scheduled_at": "1000"}, "scheduled_at is not a float"),
        ({"itl_s": [0.1, "x"]}, "itl_s is not a floats"),
        ({"itl_s": None}, None),
        ({"status": None}, "status is null"),
        ({"retried": 1}, "retried is not a bool"),
        ({"error": {"a": 1}}, "error is not a str"),
    ],
)
def test_a_row_of_another_form_is_refused(change, says):
    problem = row_problem({**row("x", 0), **change})
    assert (problem is None) if says is None else (says in problem), problem


def test_rows_without_or_with_unknown_columns_are_refused():
    r = row("x", 0)
    del r["retried"]
    assert "missing ['retried']" in row_problem(r)
    assert "unknown ['<b>']" in row_problem({**row("x", 0), "<b>": 1})
    assert "not a mapping" in row_problem([1, 2])


def test_the_collector_writes_only_this_runs_rows_of_the_senders_share_once(plan, tmp_path):
    intake = Intake(RUN, plan, 2)
    mine = [s.request_id for s in share(plan, 0, 2).open_requests]
    theirs = [s.request_id for s in share(plan, 1, 2).open_requests]
    warnings: list[str] = []
    c = Collector(tmp_path, {}, intake, warn=lambda fmt, *a: warnings.append(fmt % a))
    batch = [
        row(mine[0], 0),
        row(mine[1], 0, run_id="other-run"),  # another run's
        row(theirs[0], 0),  # worker 1's share
        row(theirs[1], 1),  # says worker 1, sent by worker 0
        row("<script>", 0),  # no request of the plan
        row(mine[0], 0),  # received already
        row(mine[2], 0, prompt_tokens="ten"),  # of another form
        row(mine[3], 0),
    ]
    assert c.add_rows(0, {"worker": 1, "pid": 42, "rows": batch}) == 6
    # worker 1 sends worker 0's id: refused, not written twice
    assert c.add_rows(1, {"worker": 0, "pid": 43, "rows": [row(mine[0], 1)]}) == 1
    for bad in ({"pid": "../../x", "rows": []}, {"pid": 42, "rows": 5}, 7, {"pid": True}):
        assert c.add_rows(0, bad) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client-0-42.jsonl"]
    written = [json.loads(line) for line in (tmp_path / "client-0-42.jsonl").read_text().split()]
    assert [r["request_id"] for r in written] == [mine[0], mine[3]]
    assert c.refused == {0: 10, 1: 1}
    assert any("run_id 'other-run' is not this run's" in w for w in warnings), warnings
    s = c.add_summary(0, {"run_id": RUN, "worker": 1, "pid": 42, "rows": 8, "error": None})
    assert s["worker"] == 0 and s["rows_refused"] == 10
    for bad in (
        {"run_id": "other", "pid": 42},
        {"run_id": RUN, "pid": "42"},
        {"run_id": RUN, "pid": 0},
        {"run_id": RUN, "pid": 42, "status_counts": {"ok": "many"}},
        {"run_id": RUN, "pid": 42, "rows": math.inf},
        [RUN],
    ):
        assert summary_problem(bad, RUN) is not None, bad
        assert c.add_summary(1, bad) is None
    c.close()
    merged = merge_records(tmp_path)
    assert merged["rows"] == 2 and merged["run_id"] == RUN
    assert merged["workers_expected"] is None and merged["workers_started"] is None


def test_a_master_without_a_plan_accepts_no_row(tmp_path):
    c = Collector(tmp_path, {}, Intake(RUN, None, 1), warn=lambda *a: None)
    assert c.add_rows(0, {"pid": 1, "rows": [row("locust_small-11-0000000", 0)]}) == 1


# -- the custom messages' sender ----------------------------------------------------------
class FakeRunner:
    """What MasterGuard and the handlers use of a MasterRunner."""

    def __init__(self, clients=()) -> None:
        self.clients = {c: object() for c in clients}
        self.handled: list = []
        self.server = SimpleNamespace()

    def handle_message(self, client_id, msg):
        self.handled.append((client_id, msg.type))
        if msg.type == "client_ready":
            msg.data[0:4]  # as Locust's: a number kills its listener
            self.clients[client_id] = object()

    def reset_connection(self):
        pass


def master_side(tmp_path, plan, workers=("w0", "w1")) -> MasterSide:
    env = SimpleNamespace(process_exit_code=None, parsed_options=None)
    master = MasterSide(env, MasterGuard(FakeRunner(workers)), {})
    master.worker_of = {cid: i for i, cid in enumerate(workers)}
    master.clients = dict(enumerate(workers))
    master.workers = len(workers)
    master.run_id = RUN
    master.plan = plan
    master.collector = Collector(tmp_path, {}, Intake(RUN, plan, len(workers)))
    return master


def test_custom_messages_of_a_client_that_is_not_a_numbered_worker_are_ignored(
    plan, tmp_path, caplog
):
    master = master_side(tmp_path, plan)
    mine = share(plan, 0, 2).open_requests[0].request_id
    env = master.environment
    # the forged end of the run that stopped every distributed run early
    master._on_done_message(env, Message("schedscope_done", {"worker": 0}, "rogue"))
    rows = {"worker": 0, "pid": 9, "rows": [row(mine, 0)]}
    master._on_rows_message(env, Message("schedscope_rows", rows, "rogue"))
    pong = {"worker": 0, "seq": 0, "t0": 1.0, "t1": 2.0, "t2": 3.0}
    master.probes.pings = {0: {0: 1.0}}
    master._on_pong_message(env, Message("schedscope_pong", pong, "rogue"))
    assert master.done == {} and master.probes.pongs == {} and not list(tmp_path.iterdir())
    assert master.guard.refused == 3 and master.guard.refused_by == {"rogue": 3}
    warned = [r.getMessage() for r in caplog.records if "rogue" in r.getMessage()]
    assert len(warned) == 1 and "client 'rogue'" in warned[0]  # once per sender


def test_the_worker_index_is_the_senders_never_the_messages(plan, tmp_path):
    master = master_side(tmp_path, plan)
    env = master.environment
    theirs = share(plan, 1, 2).open_requests[0].request_id
    # w1 says it is worker 0: its rows and summary are worker 1's all the same
    rows = {"worker": 0, "pid": 9, "rows": [row(theirs, 1)]}
    master._on_rows_message(env, Message("schedscope_rows", rows, "w1"))
    summary = {"worker": 0, "run_id": RUN, "pid": 9, "rows": 1, "error": None}
    master._on_done_message(env, Message("schedscope_done", summary, "w1"))
    assert set(master.done) == {1} and master.done[1]["worker"] == 1
    assert (tmp_path / "client-1-9.jsonl").is_file() and (tmp_path / "summary-1-9.json").is_file()
    # a second summary, one of another run, one of another form: ignored
    master._on_done_message(env, Message("schedscope_done", summary, "w1"))
    master._on_done_message(env, Message("schedscope_done", {**summary, "run_id": "x"}, "w0"))
    master._on_done_message(env, Message("schedscope_done", "done", "w0"))
    assert set(master.done) == {1} and master.guard.refused == 3


def test_a_pong_from_the_pinged_worker_is_its_probe(plan, tmp_path):
    master = master_side(tmp_path, plan)
    probes = master.probes
    t0 = clock.unix_now()
    probes.pings = {0: {0: t0}, 1: {0: t0}}
    pong = {"seq": 0, "t0": t0, "t1": t0 + 0.25, "t2": t0 + 0.25}
    master._on_pong_message(master.environment, Message("schedscope_pong", pong, "w1"))
    assert list(probes.pongs) == [1] and abs(probes.pongs[1][0].offset_s - 0.25) < 0.01
    # the same pong again, and an impossible one: refused
    master._on_pong_message(master.environment, Message("schedscope_pong", pong, "w1"))
    probes.pings[0][0] = t0
    late = {"seq": 0, "t0": t0, "t1": t0 + 10.0, "t2": t0 + 3610.0}
    master._on_pong_message(master.environment, Message("schedscope_pong", late, "w0"))
    assert list(probes.pongs) == [1] and master.guard.refused == 2


# -- frames -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frames", "says"),
    [
        ([b"rogue", msgpack.packb(5)], "not a Locust message (TypeError)"),
        ([b"rogue", b"\xc1"], "not a Locust message"),
        ([b"rogue", b""], "not a Locust message"),
        ([b"rogue", msgpack.packb([1, 2, 3])], "of another form"),
        ([b"rogue", msgpack.packb(["x", None, {"a": 1}])], "of another form"),
        ([b"rogue", Message("schedscope_done", {}, "w0").serialize()], "claims to be from"),
        ([b"\xff\xfe", Message("heartbeat", {}, "w0").serialize()], "not UTF-8"),
        ([b"rogue"], "no frame"),
    ],
)
def test_frames_the_master_drops(frames, says):
    _sender, msg, why = decode(frames)
    assert msg is None and says in why, why


def test_a_message_decodes_with_its_connections_identity_as_sender():
    sender, msg, why = decode([b"w0", Message("heartbeat", {"state": "ready"}, "w0").serialize()])
    assert (sender, msg.type, msg.node_id, why) == ("w0", "heartbeat", "w0", None)


def test_the_guard_survives_what_kills_locusts_handlers():
    runner = FakeRunner(["w0"])
    guard = MasterGuard(runner).install()
    # Locust's own handler raises on this one: dropped, counted, the listener goes on
    runner.handle_message("rogue", Message("client_ready", 5, "rogue"))
    # a peer that never registered: nothing but Locust's registration reaches Locust
    runner.handle_message("rogue", Message("exception", None, "rogue"))
    runner.handle_message("rogue", Message("schedscope_done", {"worker": 0}, "rogue"))
    assert guard.refused == 3 and runner.handled == [("rogue", "client_ready")]
    runner.handle_message("w0", Message("heartbeat", {}, "w0"))
    runner.handle_message("w1", Message("client_ready", "2.47.0", "w1"))
    runner.handle_message("w1", Message("schedscope_rows", {}, "w1"))
    assert runner.handled[1:] == [
        ("w0", "heartbeat"),
        ("w1", "client_ready"),
        ("w1", "schedscope_rows"),
    ]


def test_with_a_token_only_the_workers_that_present_it_are_trusted():
    runner = FakeRunner(["w0", "w1", "rogue"])
    guard = MasterGuard(runner, "s3cret").install()
    runner.handle_message("w0", Message(HELLO, {"token": "s3cret"}, "w0"))
    runner.handle_message("rogue", Message(HELLO, {"token": "guess"}, "rogue"))
    runner.handle_message("w1", Message(HELLO, "s3cret", "w1"))
    guard.wait_for_hellos(["w0"], 0.1)
    assert [c for c in ("w0", "w1", "rogue") if guard.trusted(c)] == ["w0"]
    runner.handle_message("rogue", Message("schedscope_done", {"worker": 0}, "rogue"))
    runner.handle_message("w0", Message("schedscope_done", {}, "w0"))
    assert [h for h in runner.handled if h[1] == "schedscope_done"] == [("w0", "schedscope_done")]
    assert guard.refused == 3 and guard.facts()["token_required"] is True
    assert MasterGuard(FakeRunner()).trusted("anyone")  # no token: every worker


def test_while_a_run_is_on_only_its_workers_are_heard():
    runner = FakeRunner(["w0"])
    guard = MasterGuard(runner).install()
    guard.lock(["w0"])
    # a peer registering mid-run would join Locust's dispatch: dropped, registration too
    for kind, data in (("client_ready", "2.47.0"), ("stats", {}), ("heartbeat", {})):
        runner.handle_message("late", Message(kind, data, "late"))
    runner.handle_message("w0", Message("heartbeat", {"state": "running"}, "w0"))
    assert runner.handled == [("w0", "heartbeat")] and guard.refused == 3
    guard.unlock()
    runner.handle_message("late", Message("client_ready", "2.47.0", "late"))
    assert runner.handled[-1] == ("late", "client_ready")


def test_a_stats_report_locust_cannot_read_is_dropped_before_it_reaches_locust():
    from locust.stats import RequestStats

    stats = RequestStats()
    stats.log_request("POST", "ttft short_chat", 12, 0)
    stats.log_error("POST", "e2e short_chat", "boom")
    good = {
        "stats": stats.serialize_stats(),
        "errors": stats.serialize_errors(),
        "stats_total": stats.total.get_stripped_report(),
    }
    assert stats_problem(good) is None
    bad_count = {
        **good,
        "errors": {k: {**e, "occurrences": "9"} for k, e in good["errors"].items()},
    }
    for bad in ({}, [], {**good, "stats": [{}]}, {**good, "stats_total": None}, bad_count):
        assert stats_problem(bad) is not None, bad
    runner = FakeRunner(["w0"])
    guard = MasterGuard(runner).install()
    runner.handle_message("w0", Message("stats", {}, "w0"))
    runner.handle_message("w0", Message("stats", good, "w0"))
    assert runner.handled == [("w0", "stats")] and guard.refused == 1


# -- what the split message carries -------------------------------------------------------
class FakeMaster(MasterRunner):
    """A MasterRunner with two connected workers that answer the clock probes at once."""

    def __init__(self, state: _State, ids=("w0", "w1")) -> None:  # no socket
        self.state = state
        nodes = [SimpleNamespace(id=i) for i in ids]
        self.clients = SimpleNamespace(ready=nodes, running=[], spawning=[])
        self.sent: list = []
        self.greenlet = None  # Runner.__del__ kills its greenlets: none here

    def get_worker_index(self, client_id):
        return int(client_id[1:])

    def handle_message(self, client_id, msg):
        pass

    def reset_connection(self):
        pass

    def send_message(self, msg_type, data=None, client_id=None):
        self.sent.append((msg_type, data, client_id))
        if msg_type == "schedscope_ping":
            t = clock.unix_now()
            pong = Message("schedscope_pong", {**data, "t1": t, "t2": t}, client_id)
            self.state.master._on_pong_message(None, pong)


def parsed(tmp_path, **values) -> argparse.Namespace:
    options = {**LoadgenOptions().to_dict(), "records_dir": str(tmp_path), **values}
    return argparse.Namespace(run_time=None, **options)


def test_the_split_message_carries_no_api_key(tmp_path):
    state = _State(load_profile(PROFILE_FILE))
    runner = FakeMaster(state)
    options = parsed(tmp_path, api_key=KEY, expect_workers=2)
    env = SimpleNamespace(
        runner=runner, parsed_options=options, host="http://t", process_exit_code=None
    )
    state.environment = env
    state.master = MasterSide(env, MasterGuard(runner), state.done)
    state.master.expected = 2
    state.on_test_start(env)
    splits = [data for kind, data, _ in runner.sent if kind == "schedscope_split"]
    assert len(splits) == 2 and env.process_exit_code is None
    for data in splits:
        assert "api_key" not in data["options"] and data["api_key_set"] is True
        assert KEY not in json.dumps(data)
    assert set(state.master.offsets) == {0, 1}
    facts = json.loads((tmp_path / WORKERS_FILE).read_text())
    assert (facts["expected"], facts["started"], facts["run_id"]) == (2, 2, state.master.run_id)
    for path in tmp_path.rglob("*"):
        assert KEY not in path.read_text()
    assert LoadgenOptions(api_key=KEY).shareable() == {
        k: v for k, v in LoadgenOptions().to_dict().items() if k != "api_key"
    }


def test_fewer_workers_than_expected_exit_1_and_are_recorded(tmp_path):
    state = _State(load_profile(PROFILE_FILE))
    runner = FakeMaster(state, ids=("w0",))
    env = SimpleNamespace(
        runner=runner, parsed_options=parsed(tmp_path), host="http://t", process_exit_code=None
    )
    state.environment = env
    state.master = MasterSide(env, MasterGuard(runner), state.done)
    state.master.expected = 2
    state.on_test_start(env)
    assert env.process_exit_code == 1
    facts = json.loads((tmp_path / WORKERS_FILE).read_text())
    assert (facts["expected"], facts["started"]) == (2, 1)


def test_the_merged_summary_has_the_masters_worker_counts(tmp_path):
    r = row("locust_small-11-0000000", 0)
    (tmp_path / "client-0-1.jsonl").write_text(json.dumps(r) + "\n")
    facts = {"run_id": RUN, "expected": 2, "started": 1, "connected": 2, "refused_messages": 4}
    (tmp_path / WORKERS_FILE).write_text(json.dumps(facts))
    merged = merge_records(tmp_path)
    assert (merged["workers_expected"], merged["workers_started"]) == (2, 1)
    assert (merged["workers_connected"], merged["refused_messages"]) == (2, 4)
    (tmp_path / WORKERS_FILE).write_text(json.dumps({**facts, "run_id": "another"}))
    assert merge_records(tmp_path)["workers_expected"] is None


# -- where the master listens, and what a remote worker is given ---------------------------
def test_the_master_listens_on_this_machine_only_unless_told():
    from harness.run.loadgen import distribution_args

    assert distribution_args(1, 2, 6000, 60)[:3] == ["--master", "--master-bind-host", "127.0.0.1"]
    assert distribution_args(3, None, 5557, 60) == [
        "--master-bind-host",
        "127.0.0.1",
        "--processes",
        "3",
    ]
    assert distribution_args(1, 2, 6000, 60, "*")[:3] == ["--master", "--master-bind-host", "*"]


@pytest.mark.parametrize(("flags", "host"), [([], "127.0.0.1"), (["--master-bind-host", "*"], "*")])
def test_schedscope_run_passes_its_master_bind_host_on(monkeypatch, flags, host):
    from typer.testing import CliRunner

    import harness.run.loadgen
    from harness.cli import app

    seen = []

    def spy(*args):
        seen.append(args)
        raise ValueError("stopped by the test")

    monkeypatch.setattr(harness.run.loadgen, "distribution_args", spy)
    result = CliRunner().invoke(app, ["run", "--executor", "sim", "--expect-workers", "2", *flags])
    assert "stopped by the test" in result.output and result.exit_code == 2, result.output
    assert seen == [(1, 2, 5557, 300.0, host)]


def test_schedscope_worker_hands_its_secrets_to_locust_in_the_environment(monkeypatch):
    import subprocess

    from typer.testing import CliRunner

    from harness.cli import app

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: calls.append((cmd, env)) or 0)
    monkeypatch.setenv("SCHEDSCOPE_API_KEY", KEY)
    monkeypatch.setenv("SCHEDSCOPE_WORKER_TOKEN", "t0ken")
    monkeypatch.delenv("LOCUST_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["worker", "--master-host", "gen-1", "--once"])
    assert result.exit_code == 0, result.output
    [(cmd, env)] = calls
    assert env["LOCUST_API_KEY"] == KEY and env["SCHEDSCOPE_WORKER_TOKEN"] == "t0ken"
    assert KEY not in " ".join(cmd) and KEY not in result.output
