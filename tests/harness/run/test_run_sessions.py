"""A served run of ``chat_sessions`` under every policy (``schedscope run --policy all``:
fcfs, sjf, priority and the cache-aware lpm) exits 0, every turn ok, and the turns after
a session's first hit the prefix cache far more than first turns, printed under each
cell and kept in its run.json."""

from __future__ import annotations

import json

import pytest

from engine.config import SCHEDULING_POLICIES
from tests.support.run_cli import schedscope_run

pytestmark = [pytest.mark.slow]


def test_chat_sessions_served_under_every_policy_hits_the_cache_on_later_turns(tmp_path):
    out = tmp_path / "run"
    args = ["--profile", "chat_sessions", "--policy", "all", "--executor", "sim"]
    args += ["--duration-scale", "0.1", "--grace", "30", "--out", str(out)]
    proc = schedscope_run(args, tmp_path / "store", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "lpm" in SCHEDULING_POLICIES
    for policy in SCHEDULING_POLICIES:
        info = json.loads((out / policy / "run.json").read_text())
        sessions = info["sessions"]
        assert sessions["turns"] == sessions["turns_ok"] > 0, (policy, sessions)
        assert sessions["later_turn_hit_rate"] > 0.5, (policy, sessions)
        assert sessions["later_turn_hit_rate"] > sessions["first_turn_hit_rate"], policy
    assert proc.stdout.count("prefix cache hit rate: turns >= 2") == len(SCHEDULING_POLICIES)
