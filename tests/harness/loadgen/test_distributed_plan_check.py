"""A distributed ``schedscope run --expect-workers 2`` whose worker does not run the
master's schedule is a failed cell that names it, and that worker sends no request.

Real processes on loopback (the sim executor): one worker's environment makes it build
another schedule (``replay`` with another ``SCHEDSCOPE_REPLAY_TRACE``), or makes its
profile fail to build; the other worker runs its share as always.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from harness.loadgen.split import share
from harness.profiles import build_plan, load_profile, resolve_profile
from harness.profiles.digest import plan_digest
from harness.report.inputs import _load_notes
from tests.harness.loadgen.test_distributed import schedscope_worker, stop_all
from tests.harness.loadgen.test_distributed_profile import _env, _wait_for_port
from tests.support.paths import REPO
from tests.support.ports import free_port

# served engines and Locust processes: the full suite's, not test-fast's
pytestmark = [pytest.mark.slow]

BROKEN_ENV = "SCHEDSCOPE_TEST_BROKEN_HERE"

#: A user's .py profile whose schedule cannot be built on a machine that lacks what it
#: needs (here: one whose environment has BROKEN_ENV).
BROKEN_PROFILE = f'''"""Builds its schedule only where {BROKEN_ENV} is not set."""
import os

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, ProfileError, RequestClass


class OnlyOnSomeMachines(Profile):
    def with_duration_scale(self, factor):
        if os.environ.get("{BROKEN_ENV}"):
            raise ProfileError("lengths: /data/lengths.txt is missing on this machine")
        return super().with_duration_scale(factor)


PROFILE = OnlyOnSomeMachines(
    name="only_some_machines",
    seed=3,
    classes=(
        RequestClass(
            name="chat",
            prompt_tokens=LengthDistribution.uniform(8, 32),
            output_tokens=LengthDistribution.uniform(2, 8),
        ),
    ),
    phases=(Phase(name="open", duration_s=1.0, rate=15.0),),
)
expose(PROFILE, globals())
'''


def _write_trace(path: Path, first_prompt: int) -> Path:
    """A plain-layout trace: 12 requests over 0.9 s."""
    rows = [f"{0.08 * i:.2f},{first_prompt + i},{3 + i % 4}" for i in range(12)]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


def _distributed_run(
    tmp: Path, profile: str, master_env: dict[str, str], worker_envs: list[dict[str, str]]
) -> tuple[int, str, Path]:
    """`schedscope run --expect-workers 2` (served, sim executor) and two `schedscope
    worker --once`, each with its own environment: (exit code, output and the workers'
    logs, the cell's directory)."""
    port = free_port()
    out = tmp / "run"
    run = subprocess.Popen(
        [
            sys.executable, "-m", "harness.cli", "run", "--executor", "sim", "--policy", "fcfs",
            "--profile", profile, "--duration-scale", "1", "--grace", "10", "--no-report",
            "--out", str(out), "--expect-workers", "2", "--master-port", str(port),
            "--master-bind-host", "127.0.0.1", "--workers-wait", "60",
        ],
        cwd=REPO, env=master_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    workers = []
    try:
        _wait_for_port(port, run)
        for i, env in enumerate(worker_envs):
            workers.append(schedscope_worker(port, tmp, i, REPO, env))
        output, _ = run.communicate(timeout=400)
    finally:
        stop_all([run, *workers])
    logs = [(tmp / f"w{i}.log").read_text() for i in range(len(workers))]
    return run.returncode, "\n".join([output, *logs]), out / "fcfs"


def _worker_notes(info: dict) -> list[str]:
    """The report's LOAD lines but a generator-limited load's (a busy machine's own)."""
    return [n for n in _load_notes(info) if not n.startswith("generator-limited:")]


def _failure(cell: Path, kind: str) -> tuple[dict, dict]:
    """The cell's run.json and its one failure of ``kind``."""
    info = json.loads((cell / "run.json").read_text())
    [failure] = [f for f in info["failures"] if f["kind"] == kind]
    return info, failure


def test_a_worker_with_another_schedule_sends_nothing_and_fails_the_cell(tmp_path, monkeypatch):
    mine = _write_trace(tmp_path / "trace.csv", 20)
    other = _write_trace(tmp_path / "other_trace.csv", 40)  # the same arrivals, other lengths
    master_env = {**_env(), "SCHEDSCOPE_REPLAY_TRACE": str(mine)}
    other_env = {**_env(), "SCHEDSCOPE_REPLAY_TRACE": str(other)}
    code, output, cell = _distributed_run(tmp_path, "replay", master_env, [master_env, other_env])
    assert code == 1, output  # an infrastructure failure of the cell
    assert "its schedule is not the master's" in (tmp_path / "w1.log").read_text(), output

    plans = {}
    for name, trace in (("master", mine), ("worker", other)):
        monkeypatch.setenv("SCHEDSCOPE_REPLAY_TRACE", str(trace))
        plans[name] = build_plan(resolve_profile("replay"))
    digests = {name: plan_digest(plan) for name, plan in plans.items()}
    assert digests["master"] != digests["worker"]

    info, failure = _failure(cell, "worker_plan_mismatch")
    assert info["status"] == "failed"
    [failed] = info["loadgen"]["failed_workers"]
    victim = failed["worker"]
    victims_ids = [s.request_id for s in share(plans["master"], victim, 2).open_requests]
    message = failure["message"]
    assert message.startswith(f"load-generator worker {victim} (")  # its Locust client id
    assert "): its schedule is not the master's: digest " in message
    assert f"{digests['worker']} (profile replay, seed 0, 12 open-loop requests)" in message
    assert f"against the master's {digests['master']}" in message
    assert f"{len(victims_ids)} of its {len(victims_ids)} scheduled open-loop requests" in message
    assert failed["plan_mismatch"]["master"]["digest"] == digests["master"]
    assert failed["missing_request_ids"] == victims_ids
    assert _worker_notes(info) == [message]  # the report's LOAD line

    # The other worker ran its whole share; the victim sent nothing, not even a probe.
    frame = pl.read_parquet(cell / "requests.parquet")
    assert set(frame["worker"]) == {1 - victim} and (frame["status"] == "ok").all()
    survivor = [s.request_id for s in share(plans["master"], 1 - victim, 2).open_requests]
    assert sorted(frame["request_id"]) == sorted(survivor)
    [summary] = [s for s in _summaries(cell) if s["worker"] == 1 - victim]
    engine = set(pl.read_parquet(cell / "raw" / "engine_requests.parquet")["request_id"])
    probes = engine - set(survivor)
    assert len(probes) == summary["probe_requests"], probes
    assert all(p.endswith(f"-{summary['pid']}") for p in probes), probes
    assert not list((tmp_path / "w1").rglob("client-*.jsonl"))


def test_a_worker_whose_profile_fails_to_build_fails_the_cell_with_its_error(tmp_path):
    profile = tmp_path / "only_some_machines.py"
    profile.write_text(BROKEN_PROFILE)
    env = _env()
    code, output, cell = _distributed_run(
        tmp_path, str(profile), env, [env, {**env, BROKEN_ENV: "1"}]
    )
    assert code == 1, output
    info, failure = _failure(cell, "worker_failed")
    [failed] = info["loadgen"]["failed_workers"]
    victim = failed["worker"]
    scheduled = share(build_plan(load_profile(str(profile))), victim, 2).num_open
    assert scheduled > 0
    assert failure["message"].startswith(f"load-generator worker {victim} (")
    assert (
        "could not start: ProfileError: lengths: /data/lengths.txt is missing on this "
        f"machine; {scheduled} of its {scheduled} scheduled open-loop requests have no record"
    ) in failure["message"], failure
    assert _worker_notes(info) == [failure["message"]]
    frame = pl.read_parquet(cell / "requests.parquet")
    assert set(frame["worker"]) == {1 - victim}
    # the master's own line (Locust's output: the cell's locust.log), and the run's
    assert f"WORKER FAILED: {failure['message']}" in (cell / "locust.log").read_text()
    assert "could not start: ProfileError" in output


def _summaries(cell: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (cell / "locust").glob("summary-*.json")]
