"""The benchmark side of the contract: --quick sizes, --json, the figures' checks."""

from __future__ import annotations

import json

import pytest

from harness.bench.figure import Figure, FigureError
from harness.bench.script import (
    DEVICE_ENV,
    BenchParser,
    bench_main,
    check_figures,
    read_figures,
)


def sized_parser() -> BenchParser:
    parser = BenchParser(description="test")
    parser.sized("--requests", type=int, full=1024, quick=128)
    parser.sized("--clients", full="a,b,c", quick="a")
    return parser


def test_quick_picks_the_quick_sizes_and_a_given_value_wins():
    full = sized_parser().parse_args([])
    assert (full.requests, full.clients, full.quick, full.json) == (1024, "a,b,c", False, None)
    quick = sized_parser().parse_args(["--quick"])
    assert (quick.requests, quick.clients) == (128, "a")
    given = sized_parser().parse_args(["--quick", "--requests", "7"])
    assert (given.requests, given.clients) == (7, "a")
    assert "(default 1024; --quick: 128)" in sized_parser().format_help()


def test_the_device_comes_from_the_runner_unless_given(monkeypatch):
    parser = BenchParser()
    parser.add_device()
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert parser.parse_args([]).device == "cpu"
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([])
    assert exited.value.code == 2


def figures_run(args) -> list[Figure]:
    return [Figure("a", 1.0, "s", 2.0), Figure("b", float(args.requests), "requests")]


def test_bench_main_writes_the_figures_it_returns(tmp_path):
    out = tmp_path / "deep" / "figures.json"
    figures = bench_main(sized_parser, figures_run, ["--quick", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["quick"] is True and data["arguments"]["requests"] == 128
    assert data["benchmark"] == "test_bench_script"  # the module run() lives in
    assert read_figures(out) == figures
    assert data["figures"][0]["verdict"] == "met"


def test_figures_must_be_a_list_of_distinct_figures(tmp_path):
    with pytest.raises(FigureError, match="list of Figure"):
        check_figures([{"name": "a"}], "bench_x")
    with pytest.raises(FigureError, match="two figures named 'a'"):
        check_figures([Figure("a", 1.0), Figure("a", 2.0)], "bench_x")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(FigureError, match="not a figures file"):
        read_figures(tmp_path / "bad.json")
