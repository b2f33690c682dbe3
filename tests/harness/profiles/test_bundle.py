"""A TOML profile packed with the files it names (harness/profiles/bundle.py) loads the
same schedule where none of those files exist; too much to ship is refused, naming the
file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.profiles import ProfileError, build_plan, load_profile
from harness.profiles.bundle import pack_profile, unpack_profile
from tests.support.paths import REPO

PROFILE_TOML = """\
name = "shipped_files"
seed = 5
description = "an empirical lengths file each class, a JSONL trace, then Poisson arrivals"

[[classes]]
name = "chat"
weight = 3
max_tokens = 16
prompt_tokens = { kind = "empirical", file = "lengths/prompts.txt" }
output_tokens = { kind = "uniform", low = 2, high = 12 }

[[classes]]
name = "long"
weight = 1
priority = 1
max_tokens = 64
prompt_tokens = { kind = "uniform", low = 100, high = 200 }
output_tokens = { kind = "empirical", file = "lengths/outputs.txt" }

[[phases]]
name = "replay"
trace = { file = "trace.jsonl", default_class = "chat" }

[[phases]]
name = "poisson"
duration_s = 1.0
rate = 15.0
"""


def write_profile(directory: Path) -> Path:
    """A TOML profile in ``directory`` naming three files beside it (relative names):
    a 1 s JSONL trace of 15 requests and two empirical lengths files."""
    (directory / "lengths").mkdir(parents=True)
    (directory / "lengths" / "prompts.txt").write_text(
        "# prompt lengths\n" + "\n".join(str(8 + 7 * i) for i in range(9)) + "\n"
    )
    (directory / "lengths" / "outputs.txt").write_text("20\n27\n33\n40\n")
    rows = [
        {
            "arrival_s": round(0.065 * i, 3),
            "prompt_tokens": 10 + 3 * i,
            "output_tokens": 2 + i % 9,
            **({"class": "long"} if i % 4 == 3 else {}),
        }
        for i in range(15)
    ]
    (directory / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = directory / "shipped_files.toml"
    path.write_text(PROFILE_TOML)
    return path


def schedule(profile) -> list[tuple]:
    return [
        (s.request_id, s.scheduled_at, s.class_name, s.prompt_tokens, s.output_tokens)
        for s in build_plan(profile).open_loop_requests()
    ]


def test_a_packed_profile_loads_the_same_schedule_without_its_files(tmp_path):
    path = write_profile(tmp_path / "profile")
    expected = schedule(load_profile(path))
    scaled = schedule(load_profile(path).with_rate_scale(2.0))
    packed = pack_profile(path)
    shutil.rmtree(tmp_path / "profile")  # the worker has none of the files
    profile = unpack_profile(packed)
    assert schedule(profile) == expected
    assert {c for _, _, c, _, _ in expected} == {"chat", "long"} and len(expected) > 15
    # a rate scale reads the trace again: it is still there
    assert schedule(profile.with_rate_scale(2.0)) == scaled


def test_too_much_to_ship_is_refused_naming_the_file(tmp_path):
    path = write_profile(tmp_path)
    with pytest.raises(
        ProfileError, match=r"1670 bytes, more than the 100 bytes .*largest: trace\.jsonl, 973"
    ):
        pack_profile(path, limit=100)


def test_a_missing_file_fails_as_loading_says(tmp_path):
    path = write_profile(tmp_path)
    (tmp_path / "trace.jsonl").unlink()
    with pytest.raises(ProfileError, match="trace.jsonl"):
        pack_profile(path)


def test_schedscope_run_refuses_a_profile_too_large_to_ship(tmp_path):
    """With --expect-workers, a profile whose files exceed what is shipped is a usage
    error at the start (exit 2), naming the file; sized by its length, not read."""
    path = write_profile(tmp_path)
    with (tmp_path / "trace.jsonl").open("r+b") as f:
        f.truncate(17 * 2**20)  # sparse: no 17 MiB written
    done = subprocess.run(
        [
            sys.executable, "-m", "harness.cli", "run", "--executor", "sim", "--policy", "fcfs",
            "--profile", str(path), "--expect-workers", "1", "--no-report",
            "--out", str(tmp_path / "run"),
        ],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert "more than the 16.0 MiB a distributed run ships" in said, said
    assert "largest: trace.jsonl, 17.0 MiB" in said, said
    assert not (tmp_path / "run").exists()
