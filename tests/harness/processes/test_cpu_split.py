"""Disjoint cores for the served engine and its load generator
(``harness.processes.cpu_split``): the --cpu-split values, the automatic split, pinning a
real child process, and the split in the cost model's fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.costmodel.machine import Fingerprint, fingerprint
from harness.processes.cpu_split import (
    CpuSplit,
    CpuSplitError,
    auto_split,
    load_generator_cores,
    parse_cpu_split,
    pin,
    serve_cores,
    split_of,
)

CPUS = (0, 1, 2, 3)


def test_auto_gives_the_server_the_first_half_rounded_up():
    assert auto_split((0, 1)) == CpuSplit((0,), (1,), "auto")
    assert auto_split((0, 1, 2)) == CpuSplit((0, 1), (2,), "auto")
    assert auto_split((4, 2, 3, 5)) == CpuSplit((2, 3), (4, 5), "auto")


def test_one_core_is_not_split():
    assert auto_split((0,)) is None
    assert parse_cpu_split("auto", (3,)) is None


@given(st.sets(st.integers(0, 63), min_size=2, max_size=64))
def test_auto_split_is_disjoint_and_covers_every_core(cpus):
    split = auto_split(tuple(cpus))
    assert split is not None
    assert set(split.serve).isdisjoint(split.load_generator)
    assert set(split.serve) | set(split.load_generator) == cpus
    assert len(split.serve) >= len(split.load_generator) >= 1


def test_given_lists_and_ranges():
    assert parse_cpu_split("0:1", CPUS) == CpuSplit((0,), (1,), "given")
    assert parse_cpu_split("0-2:3", CPUS) == CpuSplit((0, 1, 2), (3,), "given")
    assert parse_cpu_split(" 0,2 : 1,3 ", CPUS) == CpuSplit((0, 2), (1, 3), "given")
    assert parse_cpu_split("off", CPUS) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "expected auto, off or SERVE:LOAD"),
        ("0-1:1", "CPU 1 on both sides"),
        ("0:7", "CPU 7 not available"),
        (":1", "SERVE names no CPU"),
        ("0:x", "'x' is not a CPU id"),
        ("2-1:3", "'2-1' is not a range"),
    ],
)
def test_bad_values_say_what_is_wrong(text, says):
    with pytest.raises(CpuSplitError, match=says):
        parse_cpu_split(text, CPUS)


def test_line_names_both_sides_as_ranges():
    line = CpuSplit((0, 1, 2, 5), (6,), "given").line()
    assert line == ("CPU split (given): schedscope serve on CPU 0-2,5, the load generator on CPU 6")


def test_split_of_a_fingerprints_cores():
    assert split_of(1, (0, 1)) == CpuSplit((0,), (1,), "auto")
    assert split_of(0, (0, 1)) is None
    assert split_of(2, (0, 1)) is None  # no core left for the load generator
    assert serve_cores(None) == 0
    assert serve_cores(CpuSplit((0, 1), (2,))) == 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin apart")
def test_pin_moves_a_running_process_and_the_threads_it_starts():
    mine = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, threading, time\n"
            "sys.stdin.readline()\n"  # waits until pinned
            "seen = []\n"
            "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
            "t.start(); t.join()\n"
            "print(sorted(os.sched_getaffinity(0)), seen[0])\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pin(child.pid, (mine[-1],))
        out, _ = child.communicate("go\n", timeout=30)
    finally:
        child.kill()
    assert out.split() == [f"[{mine[-1]}]", f"[{mine[-1]}]"]


def test_the_split_is_part_of_the_fingerprint():
    pinned = fingerprint("tiny", executor="sim", serve_cores=1, cores=2, torch_threads=1)
    free = fingerprint("tiny", executor="sim", serve_cores=0, cores=2, torch_threads=1)
    assert pinned.key != free.key
    assert "serve pinned to 1" in pinned.describe()
    assert "pinned" not in free.describe()


def test_torch_threads_default_follows_the_servers_cores():
    assert fingerprint("tiny", serve_cores=8, cores=16).torch_threads == 7
    assert fingerprint("tiny", serve_cores=1, cores=2).torch_threads == 1


def test_a_fit_stored_before_pinning_reads_back_as_unpinned():
    data = fingerprint("tiny", executor="sim", serve_cores=0).to_dict()
    del data["serve_cores"]
    assert Fingerprint.from_dict(data).serve_cores == 0


def test_the_load_generator_is_pinned_beside_a_served_engine_and_against_a_target_only_if_told():
    auto, given = CpuSplit((0,), (1,), "auto"), CpuSplit((0,), (1,), "given")
    assert load_generator_cores(auto, against_target=False) == (1,)
    assert load_generator_cores(given, against_target=False) == (1,)
    assert load_generator_cores(given, against_target=True) == (1,)
    assert load_generator_cores(auto, against_target=True) is None
    assert load_generator_cores(None, against_target=False) is None
    assert parse_cpu_split("1:0", (0, 1)) == CpuSplit((1,), (0,), "given")
