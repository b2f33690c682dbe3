"""Collecting the benchmarks: every bench_*.py follows the contract, a file that does
not is named, and a command line's names select a subset or are refused."""

from __future__ import annotations

import pytest

from harness.bench.collect import (
    BENCHMARKS_DIR,
    BenchCollectionError,
    UnknownBenchmarkError,
    collect,
    contract_problems,
    select,
)
from tests.support.fake_benchmarks import GOOD, NO_CONTRACT, write


def test_every_benchmark_of_the_checkout_follows_the_contract():
    files = sorted(p.stem for p in BENCHMARKS_DIR.glob("bench_*.py"))
    benchmarks = collect()
    assert [b.module for b in benchmarks] == files
    assert len(benchmarks) >= 17
    assert {"serving", "scheduler", "model", "batching"} <= {b.name for b in benchmarks}
    assert all(b.summary for b in benchmarks)  # each says what it measures


def test_a_benchmark_without_the_contract_is_an_error_naming_it(tmp_path):
    folder = write(tmp_path / "benchmarks", good=GOOD, old=NO_CONTRACT)
    with pytest.raises(BenchCollectionError) as caught:
        collect(folder)
    message = str(caught.value)
    assert "bench_old.py" in message and "bench_good.py" not in message
    assert "def parser()" in message and "def run(args)" in message and "bench_main" in message


def test_what_the_contract_asks_for():
    assert contract_problems(GOOD) == []
    two_args = GOOD.replace("def run(args):", "def run(args, quick):")
    assert contract_problems(two_args) == [
        "run() taking exactly one argument (the parsed arguments)"
    ]
    no_main = GOOD.replace("    bench_main(parser, run)", "    pass")
    assert len(contract_problems(no_main)) == 1 and "bench_main" in contract_problems(no_main)[0]


def test_a_file_that_does_not_parse_is_named(tmp_path):
    folder = write(tmp_path / "b", broken="def run(:\n")
    with pytest.raises(BenchCollectionError, match=r"bench_broken\.py lacks valid Python"):
        collect(folder)


def test_a_missing_or_empty_folder_is_an_error(tmp_path):
    with pytest.raises(BenchCollectionError, match="no benchmarks folder"):
        collect(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchCollectionError, match="no bench_"):
        collect(tmp_path / "empty")


def test_names_select_a_subset_in_the_folders_order():
    benchmarks = collect()
    chosen = select(benchmarks, ["serving", "bench_scheduler", "bench_model.py"])
    assert [b.name for b in chosen] == ["model", "scheduler", "serving"]
    assert select(benchmarks, []) == benchmarks
    assert [b.name for b in select(benchmarks, ["serving", "serving"])] == ["serving"]


def test_an_unknown_name_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(UnknownBenchmarkError) as caught:
        select(collect(), ["serving", "servng", "bench_nothing"])
    message = str(caught.value)
    assert "servng" in message and "bench_nothing" in message
    assert "known: batching" in message
