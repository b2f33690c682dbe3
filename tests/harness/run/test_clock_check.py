"""A served cell checks that the engine's clock agrees with the load generator's, and
corrects the engine's instants when the machine's wall clock stepped between their
starts (harness/run/clock_check.py).

The bug this guards: CI's `schedscope run` cell had an engine admission 1.32 s *before*
the client sent the request (first_scheduled_at - sent_at = -1.32 s), because each
process reads the wall clock once, at start, and the VM's clock was stepped in between.
"""

from __future__ import annotations

import json
import re

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.loadgen import clock
from harness.run.clock_check import check_clocks
from tests.support.run_cli import schedscope_run

EPOCH = 1_800_000_000.0


def frames(offset_s: float, delays: list[tuple[float, float]], n_offset: int | None = None):
    """Client rows (Unix) and engine rows (engine time) of requests sent once a second;
    the engine's clock reads ``offset_s`` early (for the first ``n_offset`` rows, all
    when None); ``delays``: (send -> arrival, emission -> receipt) seconds per request."""
    client, engine = [], []
    for i, (up, down) in enumerate(delays):
        sent = EPOCH + 10.0 + i
        emitted = sent + up + 0.05
        off = offset_s if n_offset is None or i < n_offset else 0.0
        client.append({"request_id": f"r{i}", "sent_at": sent, "first_token_at": emitted + down})
        engine.append(
            {
                "request_id": f"r{i}",
                "scheduled_at": sent + up - EPOCH - off,
                "first_token_at": emitted - EPOCH - off,
            }
        )
    return pl.DataFrame(client), pl.DataFrame(engine)


LOOPBACK = [(0.0004, 0.0003), (0.002, 0.001), (0.3, 0.2)]


def test_agreeing_clocks_are_left_alone():
    client, engine = frames(0.0, LOOPBACK)
    check = check_clocks(client, engine, EPOCH)
    assert check.agree and check.shift_s == 0.0 and check.warning() is None
    assert check.low_s < 0 < check.high_s and check.requests == 3


def test_an_engine_clock_1_32_s_early_is_corrected_and_said():
    client, engine = frames(1.32, LOOPBACK)
    check = check_clocks(client, engine, EPOCH)
    assert not check.agree and check.consistent
    assert abs(check.shift_s - 1.32) < 0.001
    assert "+1320" in check.warning()


def test_a_step_during_the_run_is_warned_of_not_corrected():
    client, engine = frames(1.32, LOOPBACK, n_offset=1)
    check = check_clocks(client, engine, EPOCH)
    assert not check.consistent and check.shift_s == 0.0
    assert "did not keep one offset" in check.warning()


def test_no_engine_columns_no_check():
    client, _ = frames(0.0, LOOPBACK)
    check = check_clocks(client, pl.DataFrame({"request_id": ["r0"]}), EPOCH)
    assert check.agree and check.shift_s == 0.0 and check.low_s is None


@settings(max_examples=200, deadline=None)
@given(
    offset=st.floats(-5.0, 5.0),
    delays=st.lists(
        st.tuples(st.floats(0.0001, 0.002), st.floats(0.0001, 0.002)), min_size=1, max_size=20
    ),
)
def test_the_corrected_engine_clock_is_within_the_delays_of_the_truth(offset, delays):
    """Whatever the offset, after the shift the engine's clock is off by no more than
    the round trip of the best request (plus the tolerance when left alone)."""
    client, engine = frames(offset, delays)
    check = check_clocks(client, engine, EPOCH)
    assert check.consistent
    best_round_trip = min(up + down for up, down in delays)
    assert abs(check.shift_s - offset) <= best_round_trip + check.tolerance_s + 1e-9


def test_unix_now_runs_on_the_monotonic_clock():
    """The load generator's instants do not follow a wall-clock step made after start."""
    import time

    before = clock.unix_now()
    real = time.time
    try:
        time.time = lambda: real() - 1.32  # the machine's clock stepped back
        after = clock.unix_now()
    finally:
        time.time = real
    assert 0 <= after - before < 1.0


# A sitecustomize that puts every Python process of the run except Locust's 1.5 s behind:
# the engine reads its epoch from a clock stepped back after the load generator started.
SITECUSTOMIZE = """
import time
with open("/proc/self/cmdline", "rb") as f:
    _cmd = f.read()
if b"locust" not in _cmd:
    _real = time.time
    time.time = lambda: _real() - 1.5
"""


def test_served_cell_with_its_engine_clock_behind_is_joined_on_one_clock(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = tmp_path / "run"
    proc = schedscope_run(
        ["--executor", "sim", "--policy", "fcfs", "--duration-scale", "0.03", "--grace", "20"]
        + ["--out", str(out)],
        tmp_path / "store",
        extra_path=site,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads((out / "fcfs" / "run.json").read_text())
    assert abs(info["engine_clock"]["shift_s"] - 1.5) < 0.1, info["engine_clock"]
    # the warning names the offset it measured: 1.5 s, to the same 0.1 s (it read
    # +1499.9 ms once: a check of the text "+15" failed on a right value)
    said = [re.search(r"clock was ([+-][\d.]+) ms off", w) for w in info["warnings"]]
    offsets = [float(m.group(1)) for m in said if m]
    assert offsets and abs(offsets[0] - 1500) < 100, info["warnings"]
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet").filter(pl.col("status") == "ok")
    assert frame.height > 0
    lag = frame.select((pl.col("first_scheduled_at") - pl.col("sent_at")).min()).item()
    assert -0.05 < lag < 5.0
    spans = pl.read_parquet(out / "fcfs" / "spans.parquet")
    # Spans, decisions and steps moved with the requests: the first request's span
    # starts at its arrival; every admission follows its send, inside its own step.
    first = frame.sort("sent_at").row(0, named=True)
    root = spans.filter(
        (pl.col("name") == "llm_request") & (pl.col("request_id") == first["request_id"])
    )
    assert abs(root["start"][0] - first["engine_arrival_at"]) < 0.05
    admits = (
        pl.read_parquet(out / "fcfs" / "decisions.parquet")
        .filter(pl.col("kind") == "admit")
        .join(frame.select("request_id", "sent_at"), on="request_id")
        .join(pl.read_parquet(out / "fcfs" / "steps.parquet"), on="step")
    )
    assert admits.height == frame.height
    assert (admits["time"] - admits["sent_at"]).min() > -0.05
    assert (admits["time"] - admits["schedule_start"]).min() > -1e-6
    assert (admits["execute_end"] - admits["time"]).min() > -1e-6
