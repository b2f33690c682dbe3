"""SIGTERM to `schedscope run` (a cancelled CI job) stops what the run started: its
server and Locust processes end with it instead of running on as orphans; the run exits
143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import REPO


def children(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid``: pid -> command line (from /proc)."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            )
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = commands.get(child, "")
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_the_server_and_locust_it_started(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [
        "run",
        "--executor",
        "sim",
        "--policy",
        "fcfs",
        "--duration-scale",
        "0.5",
        "--out",
        str(tmp_path / "run"),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            started = children(proc.pid)
            if any("locust" in c for c in started.values()) and any(
                " serve " in c for c in started.values()
            ):
                break
            assert proc.poll() is None, "the run ended before its load started"
            time.sleep(0.5)
        else:
            raise AssertionError(f"no server and Locust under the run: {started}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in started):
            time.sleep(0.2)
        left = {p: c for p, c in started.items() if alive(p)}
        assert not left, f"still running after the run ended: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in started:  # what a failing run left behind: this test started them
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
