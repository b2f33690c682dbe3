"""Every shipped profile, shortened, runs headless with the real ``locust`` command
against a live bundled server (``sim`` executor) and produces complete records: every
scheduled request has a row, and the status counts match the server's own counters.
One server for the module; each profile's run is measured by the change
in the server's counters it caused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from harness.loadgen.merge import merge_records
from harness.profiles import build_plan, resolve_profile, shipped_profile_names
from harness.serve.local_server import CliServer
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow]

ROOT = REPO
LOCUST = str(Path(sys.executable).parent / "locust")
#: Shortened to a few seconds each (rates unchanged).
DURATION_SCALE = 0.04
#: Profiles whose shortened run would plan no request at 0.04 (few, slow arrivals).
DURATION_SCALES = {"agentic": 0.1}
PROFILES = sorted(set(shipped_profile_names(aliases=False)) - {"default_py_example"})


@pytest.fixture(scope="module")
def server():
    with CliServer(["--executor", "sim", "--max-model-len", "4096"]) as live:
        yield live


def counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    )


def test_the_library_is_all_here():
    assert {
        "mixed",
        "burst",
        "ramp",
        "spike",
        "priority",
        "starvation",
        "swap_pressure",
        "replay",
    } <= set(PROFILES)


@pytest.mark.parametrize("name", PROFILES)
def test_a_shipped_profile_runs_under_locust_with_complete_records(server, tmp_path, name):
    path = ROOT / "loadprofiles" / f"{name}.py"
    records = tmp_path / "records"
    before = counter(server.url, "vllm:request_success_total")
    done = subprocess.run(
        [
            LOCUST,
            "-f",
            str(path),
            "--host",
            server.url,
            "--headless",
            "--only-summary",
            "--duration-scale",
            str(DURATION_SCALES.get(name, DURATION_SCALE)),
            "--records-dir",
            str(records),
            "--grace",
            "20",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    successes = counter(server.url, "vllm:request_success_total") - before
    summary = merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    plan = build_plan(
        resolve_profile(name).with_duration_scale(DURATION_SCALES.get(name, DURATION_SCALE))
    )
    turns = [t.request_id for session in plan.sessions() for t in session.turns]
    expected = {s.request_id for s in plan.open_loop_requests()} | set(turns)
    got = set(frame.filter(pl.col("phase_kind").is_in(["open", "session"]))["request_id"])
    assert expected, "the shortened profile plans no request: the test would prove nothing"
    assert got == expected, (
        f"missing {sorted(expected - got)[:5]}, extra {sorted(got - expected)[:5]}"
    )
    assert summary["status_counts"] == {"ok": frame.height}, summary["status_counts"]
    assert successes == frame.height + summary["probe_requests"]


def test_chat_sessions_under_locust_for_20_s_exits_0_and_later_turns_hit_the_cache(
    server, tmp_path
):
    """The issue's check as a user runs it: ``locust -f loadprofiles/chat_sessions.py
    --headless -t 20s`` against a healthy server exits 0 (the sessions cut by -t are cut,
    not failed), and the turns after a session's first find the conversation cached."""
    records = tmp_path / "records"
    done = subprocess.run(
        [
            LOCUST,
            "-f",
            str(ROOT / "loadprofiles" / "chat_sessions.py"),
            "--host",
            server.url,
            "--headless",
            "--only-summary",
            "-t",
            "20s",
            "--records-dir",
            str(records),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")
    ok = frame.filter(pl.col("status") == "ok")
    first, later = ok.filter(pl.col("turn") == 1), ok.filter(pl.col("turn") > 1)
    assert first.height and later.height
    assert set(frame["phase_kind"]) == {"session"}
    hit = later["cached_tokens"].sum() / later["server_prompt_tokens"].sum()
    assert hit > 0.5, hit
    # every planned turn has a row: sent, cut by -t, or not sent (the run ended first)
    sessions = {
        s.session_id: len(s.turns) for s in build_plan(resolve_profile("chat_sessions")).sessions()
    }
    per_session = frame.group_by("session_id").len()
    for session_id, n in per_session.iter_rows():
        assert n == sessions[session_id]
