"""Ending a child process this harness started, the one way every wrapper does it:
SIGTERM, a wait for it to end on its own (a server drains and writes its records), then
SIGKILL. Only a process we started, by its own id (or its process group when it was
started in a session of its own), never by name."""

from __future__ import annotations

import os
import signal
import subprocess

#: How long a process may take to go once SIGKILL was sent.
KILL_WAIT_S = 10.0


def stop_process(process: subprocess.Popen, term_timeout_s: float, group: bool = False) -> bool:
    """SIGTERM ``process`` (its whole process group when ``group``: it was started with
    ``start_new_session``), wait up to ``term_timeout_s`` for it to end, then SIGKILL and
    wait :data:`KILL_WAIT_S`; with ``group``, whatever of the group outlives its leader is
    then killed. Nothing is signalled when it has already ended (but a group's leftovers).
    Returns True when the process had to be killed."""
    killed = False
    if process.poll() is None and _signal(process, signal.SIGTERM, group):
        try:
            process.wait(term_timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            _signal(process, signal.SIGKILL, group)
            try:
                process.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): go on
                pass
    if group:  # what the leader started and left behind goes with it
        _signal(process, signal.SIGKILL, group)
    return killed


def _signal(process: subprocess.Popen, sig: int, group: bool) -> bool:
    """Send ``sig``; False when the process (group) is already gone."""
    try:
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
    except ProcessLookupError:
        return False
    return True
