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
            str(DURATION_SCALE),
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
    plan = build_plan(resolve_profile(name).with_duration_scale(DURATION_SCALE))
    expected = {s.request_id for s in plan.open_loop_requests()}
    got = set(frame.filter(pl.col("phase_kind") == "open")["request_id"])
    assert got == expected, (
        f"missing {sorted(expected - got)[:5]}, extra {sorted(got - expected)[:5]}"
    )
    assert summary["status_counts"] == {"ok": frame.height}, summary["status_counts"]
    assert successes == frame.height + summary["probe_requests"]
