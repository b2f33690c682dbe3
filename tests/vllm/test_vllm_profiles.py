"""Every shipped profile, shortened, runs with the plain ``locust -f`` command against the
real vLLM and produces complete records: every scheduled request has a row, every row
is ok, its token counts are vLLM's own (the change in vLLM's counters the run caused),
and text prompts are exactly their target length on vLLM's tokenizer.

Each profile runs twice: with text prompts (``--prompt-mode text``, sized with vLLM's
``/tokenize``) and with ``--prompt-mode auto``, which finds that this vocabulary (1,280
ids) refuses the default ids in [1000, 3000) (one refused 1-token probe) and sends ids
below it instead: exact lengths either way.
"""

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
from tests.support.paths import REPO

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOCUST = str(Path(sys.executable).parent / "locust")
#: A few seconds of each profile, at a quarter of its rates: 5-20 requests each, which
#: vLLM's four running slots (tests/support/vllm_server.py) answer in seconds.
DURATION_SCALE = 0.04
RATE_SCALE = 0.25
#: Profiles too sparse for a quarter of their rate (no request at all).
FULL_RATE = {"swap_pressure", "agentic"}
#: Profiles with no arrival in 0.04 of their length (few, slow arrivals).
DURATION_SCALES = {"agentic": 0.1}
PROFILES = sorted(set(shipped_profile_names(aliases=False)) - {"default_py_example"})


def counters(url: str) -> dict[str, float]:
    """vLLM's counters of requests and tokens, summed over their series."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    names = ("vllm:request_success_total", "vllm:generation_tokens_total")
    return {
        name: sum(
            float(m.group(1))
            for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
        )
        for name in names
    } | {
        "prompt_tokens": sum(
            float(m.group(1))
            for m in re.finditer(r"^vllm:request_prompt_tokens_sum\{[^}]*\} (\S+)$", text, re.M)
        )
    }


#: prompt mode -> the method the rows must record
PROMPT_MODES = {"text": "tokenize", "auto": "token_ids"}


@pytest.mark.parametrize("mode", sorted(PROMPT_MODES))
@pytest.mark.parametrize("name", PROFILES)
def test_a_shipped_profile_runs_under_locust_against_vllm_with_complete_records(
    vllm_server, tmp_path, name, mode
):
    rate_scale = 1.0 if name in FULL_RATE else RATE_SCALE
    records = tmp_path / "records"
    before = counters(vllm_server.url)
    done = subprocess.run(
        [
            LOCUST,
            "-f",
            str(REPO / "loadprofiles" / f"{name}.py"),
            "--host",
            vllm_server.url,
            "--headless",
            "--only-summary",
            "--duration-scale",
            str(DURATION_SCALES.get(name, DURATION_SCALE)),
            "--rate-scale",
            str(rate_scale),
            "--prompt-mode",
            mode,
            # vLLM streams usage in every chunk; said outright, the 2-token probe (token
            # ids this vocabulary refuses) is not sent
            "--continuous-usage",
            "on",
            "--records-dir",
            str(records),
            "--grace",
            "60",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = counters(vllm_server.url)
    summary = merge_records(records)
    frame = pl.read_parquet(records / "requests.parquet")

    plan = build_plan(
        resolve_profile(name)
        .with_duration_scale(DURATION_SCALES.get(name, DURATION_SCALE))
        .with_rate_scale(rate_scale)
    )
    turns = [t for session in plan.sessions() for t in session.turns]
    expected = {s.request_id for s in plan.open_loop_requests() + turns}
    assert expected
    got = set(frame.filter(pl.col("phase_kind").is_in(["open", "session"]))["request_id"])
    assert got == expected, (
        f"missing {sorted(expected - got)[:5]}, extra {sorted(got - expected)[:5]}"
    )
    assert summary["status_counts"] == {"ok": frame.height}, summary["status_counts"]
    # auto: one 1-token probe with the default ids, which vLLM refuses (never counted)
    assert summary["probe_requests"] == (1 if mode == "auto" else 0)
    if mode == "auto":
        assert summary["prompts"]["mode"] == "token_ids", summary["prompts"]
        assert summary["prompts"]["id_range"][1] <= 1280, summary["prompts"]

    # exact prompt lengths: vLLM's count of each prompt is its target; a session's turns
    # (chat, with vLLM's template and the answers as text) and text prompts with a shared
    # part (sized by the part) are near it
    singles = frame.filter(pl.col("session_id").is_null())
    assert set(singles["prompt_method"]) <= {PROMPT_MODES[mode]}
    # a session's turns are chat text: sized with /tokenize in text mode, else by estimate
    turns = frame.filter(pl.col("session_id").is_not_null())
    assert set(turns["prompt_method"]) <= {"tokenize" if mode == "text" else "estimate"}
    shared = {s.request_id for s in plan.open_loop_requests() if s.shared}
    near = pl.col("session_id").is_not_null()
    if mode == "text":
        near = near | pl.col("request_id").is_in(list(shared))
    exact = frame.filter(~near)
    wrong = exact.filter(pl.col("server_prompt_tokens") != pl.col("prompt_tokens"))
    assert wrong.is_empty(), wrong.select("request_id", "prompt_tokens", "server_prompt_tokens")
    off = frame.filter(near).filter(
        (pl.col("server_prompt_tokens") - pl.col("prompt_tokens")).abs()
        > 0.15 * pl.col("prompt_tokens") + 16
    )
    assert off.is_empty(), off.select("request_id", "prompt_tokens", "server_prompt_tokens")
    # every output token asked for (ignore_eos), counted from vLLM's continuous usage
    assert (frame["output_tokens"] == frame["max_tokens"]).all()
    assert set(frame["token_counting"]) == {"usage"}
    # and the run's totals are vLLM's own counters' change
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == (
        frame.height
    )
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == (
        frame["output_tokens"].sum()
    )
    assert after["prompt_tokens"] - before["prompt_tokens"] == frame["server_prompt_tokens"].sum()


def test_plain_locust_against_vllm_chooses_prompts_its_vocabulary_takes(vllm_server, tmp_path):
    """``locust -f loadprofiles/mixed.py --headless -t 25s --host <vLLM>`` with no
    schedscope option: the default ``--prompt-mode auto`` finds the vocabulary's bound
    (token ids at or above it were the default, and vLLM refused them: exit 1)."""
    records = tmp_path / "records"
    done = subprocess.run(
        [
            LOCUST,
            "-f",
            str(REPO / "loadprofiles" / "mixed.py"),
            "--host",
            vllm_server.url,
            "--headless",
            "--only-summary",
            "-t",
            "25s",
            "--records-dir",
            str(records),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = merge_records(records)
    assert summary["prompts"]["requested"] == "auto", summary["prompts"]
    assert summary["prompts"]["id_range"][1] <= 1280, summary["prompts"]
    assert summary["status_counts"].get("ok", 0) > 0
    assert not set(summary["status_counts"]) - {"ok", "aborted"}, summary["status_counts"]
