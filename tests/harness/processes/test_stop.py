"""stop_process: the one way the harness ends a child it started (SIGTERM, a wait,
SIGKILL), on real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.processes.stop import stop_process

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _started(code: str, **kwargs) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **kwargs
    )
    assert process.stdout.readline().strip() == "ready"
    return process


def test_a_child_that_ends_on_sigterm_is_not_killed():
    process = _started("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    assert stop_process(process, term_timeout_s=10.0) is False
    assert process.returncode == -15  # SIGTERM ended it


def test_a_child_that_ignores_sigterm_is_killed_after_the_wait():
    process = _started(IGNORES_SIGTERM)
    started = time.monotonic()
    assert stop_process(process, term_timeout_s=0.5) is True
    assert process.returncode == -9
    assert 0.5 <= time.monotonic() - started < 10


def test_an_ended_child_is_left_alone():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(30)
    assert stop_process(process, term_timeout_s=0.1) is False
    assert process.returncode == 0


def test_a_group_stop_reaches_what_the_child_started():
    # the child starts a grandchild that ignores SIGTERM, in the child's session
    code = (
        "import subprocess, sys, time\n"
        f"g = subprocess.Popen([sys.executable, '-c', {IGNORES_SIGTERM!r}], "
        "stdout=subprocess.PIPE, text=True)\n"
        "g.stdout.readline()\n"
        "print(g.pid, flush=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    grandchild = int(process.stdout.readline())
    assert process.stdout.readline().strip() == "ready"
    stop_process(process, term_timeout_s=0.5, group=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        # a zombie until its parent's parent (init here) reaps it: gone from /proc status
        try:
            with open(f"/proc/{grandchild}/status") as f:
                if "State:\tZ" in f.read():
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the grandchild outlived the group stop")
