"""A distributed ``schedscope run --expect-workers N`` with a TOML profile: the workers
run the master's profile, and the files it names, without having them.

The master's locustfile holds the packed profile (harness/profiles/bundle.py), and
Locust sends it to ``locust -f - --worker``: here the workers run in another directory,
started after the profile's directory (given to the master by a relative path) is gone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import polars as pl
import pytest

from harness.loadgen.clock import TEST_OFFSET_ENV
from harness.profiles import build_plan, load_profile
from tests.harness.loadgen.test_distributed import schedscope_worker, stop_all
from tests.harness.profiles.test_bundle import write_profile
from tests.support.paths import REPO
from tests.support.ports import free_port

# served engines and Locust processes: the full suite's, not test-fast's
pytestmark = [pytest.mark.slow]

#: What the schedule fixes in a row (not the worker, nor timing).
SCHEDULE = [
    "request_id",
    "class",
    "phase",
    "phase_kind",
    "priority",
    "schedule_offset_s",
    "prompt_tokens",
    "output_tokens",
    "status",
]
RUN = [
    sys.executable, "-m", "harness.cli", "run", "--executor", "sim", "--policy", "fcfs",
    "--profile", "profile/shipped_files.toml", "--duration-scale", "1", "--grace", "10",
    "--no-report",
]  # fmt: skip


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop(TEST_OFFSET_ENV, None)
    return env


def _wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Until the master listens (it has loaded its locustfile by then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the master never listened on {port} (exit code {process.poll()})")


def test_workers_without_the_toml_profile_run_its_exact_schedule(tmp_path):
    master_dir, elsewhere = tmp_path / "master", tmp_path / "elsewhere"
    profile = load_profile(write_profile(master_dir / "profile"))
    scheduled = build_plan(profile).open_loop_requests()
    elsewhere.mkdir()
    one = subprocess.run(
        [*RUN, "--out", str(tmp_path / "one")],
        cwd=master_dir, env=_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert one.returncode == 0, one.stdout + one.stderr

    port = free_port()
    run = subprocess.Popen(
        [
            *RUN, "--out", str(tmp_path / "two"), "--expect-workers", "2",
            "--master-port", str(port), "--master-bind-host", "127.0.0.1",
            "--workers-wait", "30",
        ],
        cwd=master_dir, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    workers = []
    try:
        _wait_for_port(port, run)
        shutil.rmtree(master_dir / "profile")  # read by the master; no worker sees it
        for i in range(2):
            workers.append(schedscope_worker(port, tmp_path, i, elsewhere, _env()))
        output, _ = run.communicate(timeout=400)
    finally:
        stop_all([run, *workers])
    logs = "\n".join((tmp_path / f"w{i}.log").read_text() for i in range(len(workers)))
    assert run.returncode == 0, output + logs
    frames = [
        pl.read_parquet(tmp_path / d / "fcfs" / "requests.parquet").sort("request_id")
        for d in ("one", "two")
    ]
    assert set(frames[1]["worker"]) == {0, 1}
    # every request of the schedule, the trace's and the empirical lengths' included
    planned = sorted((s.request_id, s.prompt_tokens, s.output_tokens) for s in scheduled)
    assert frames[0].select("request_id", "prompt_tokens", "output_tokens").rows() == planned
    assert set(frames[0]["phase"]) == {0, 1} and set(frames[0]["class"]) == {"chat", "long"}
    assert frames[0].select(SCHEDULE).equals(frames[1].select(SCHEDULE))
