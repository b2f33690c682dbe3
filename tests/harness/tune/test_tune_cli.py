"""``schedscope tune`` end to end in the simulator (--confirm 0), on profiles with a
known answer: the starvation mix past capacity (a max-wait bound is needed) and
swap_pressure's small pool (the swap-space trap); usage errors exit 2 naming the
problem."""

import json

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.paths import DATA

runner = CliRunner(env={"COLUMNS": "400"})
STARVATION = [
    "--profile",
    str(DATA / "tune_starvation.toml"),
    "--max-num-seqs",
    "8",
    "--space",
    str(DATA / "tune_space_starvation.toml"),
    "--slo",
    "long:ttft_p99<=8s",
    "--slo",
    "short:ttft_p99<=6s",
    "--duration-scale",
    "1",
    "--precision",
    "0.2",
    "--workers",
    "1",
    "--cost-model",
    "builtin",
]


@pytest.fixture(scope="module")
def starvation(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune-starvation")
    result = runner.invoke(
        app, ["tune", *STARVATION, "--trials", "10", "--confirm", "0", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "tune.json").read_text()), result.output


def test_starvation_needs_a_max_wait_bound(starvation):
    _, tune, _ = starvation
    winner = tune["finalists"]["c1"]
    assert winner["knobs"]["scheduling_policy"] in ("sjf", "priority")
    assert winner["knobs"]["max_wait_s"] == 5.0
    assert winner["meets_at_profile_rate"] and winner["capacity"] > 1.0
    # the current config (fcfs) misses at the profile's rate: its capacity is lower
    assert not tune["current"]["meets_at_profile_rate"]
    assert tune["current"]["capacity"] < winner["capacity"]


def test_rejected_unbounded_sjf_and_priority_carry_the_starvation_trap(starvation):
    _, tune, _ = starvation
    rejected = {k: v for k, v in tune["finalists"].items() if k.startswith("r")}
    assert rejected
    for label, entry in rejected.items():
        assert not entry["meets_at_profile_rate"]
        if entry["knobs"]["scheduling_policy"] != "fcfs":
            assert entry["knobs"]["max_wait_s"] is None
            assert "starvation" in [f["trap"] for f in tune["traps"][label]]
    assert "starvation" not in [f["trap"] for f in tune["traps"]["c1"]]


def test_outputs_have_the_table_the_command_lines_and_the_front(starvation):
    out, tune, output = starvation
    assert tune["winner"]["serve"].startswith("schedscope serve ")
    assert "--max-wait-s 5" in tune["winner"]["serve"]
    assert "--max-wait-s 5.0" in tune["winner"]["vllm_missing"]
    assert tune["winner"]["vllm"].startswith("vllm serve MODEL --max-num-seqs 8")
    assert tune["front"] and tune["search"]["trials"] == 10
    md = (out / "tune.md").read_text()
    assert "## Ranked" in md and tune["winner"]["serve"] in md
    page = (out / "tune.html").read_text()
    assert 'id="plot-front"' in page and "Pareto front" in page
    assert "schedscope serve" in output and "tune.html" in output


@pytest.mark.slow
def test_the_search_is_deterministic_for_a_seed(starvation, tmp_path):
    _, first, _ = starvation
    result = runner.invoke(
        app, ["tune", *STARVATION, "--trials", "10", "--confirm", "0", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "tune.json").read_text())
    assert again["ranked"] == first["ranked"] and again["finalists"] == first["finalists"]


def test_a_small_swap_space_is_rejected_with_the_swap_trap(tmp_path):
    args = [
        "tune",
        "--profile",
        "swap_pressure",
        "--num-gpu-blocks-override",
        "384",
        "--swap-space",
        "0.004",
        "--space",
        str(DATA / "tune_space_swap.toml"),
        "--slo",
        "long_context:ttft_p99<=5s",
        "--duration-scale",
        "0.34",
        "--precision",
        "0.3",
        "--trials",
        "4",
        "--confirm",
        "0",
        "--workers",
        "1",
        "--cost-model",
        "builtin",
        "--out",
        str(tmp_path),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    tune = json.loads((tmp_path / "tune.json").read_text())
    assert tune["finalists"]["c1"]["knobs"]["swap_space"] == 1.0
    assert tune["finalists"]["c1"]["meets_at_profile_rate"]
    assert not tune["current"]["meets_at_profile_rate"]
    assert "swap_fallback" in [f["trap"] for f in tune["traps"]["current"]]
    assert "swap_fallback" not in [f["trap"] for f in tune["traps"]["c1"]]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--slo", "short_chat ttft_p95<=1s"], "CLASS:TARGET"),
        (["--slo", "short_chat:ttft_p95<=1.2.3s"], "not a number"),
        (["--slo", "short_chat:ttft_p42<=1s"], "unknown statistic"),
        (["--slo", "chat:ttft_p95<=1s"], "no class 'chat'"),
        (["--objective", "latency"], "capacity or goodput"),
        (["--space", "/nonexistent/space.toml"], "--space"),
        (["--max-num-seqs", "0"], "max_num_seqs"),
        (["--confirm-margin", "1.5"], "--confirm-margin"),
        (["--confirm-extend", "-1"], "--confirm-extend"),
    ],
)
def test_usage_errors_exit_2_naming_the_problem(args, names, tmp_path):
    result = runner.invoke(app, ["tune", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert names in " ".join(result.output.split())


def test_an_out_that_cannot_be_a_directory_is_refused_before_the_search(tmp_path):
    # `--out /etc/passwd` tracebacked after the whole search.
    file = tmp_path / "a-file"
    file.write_text("keep me\n")
    result = runner.invoke(
        app, ["tune", "--slo", "short_chat:ttft_p95<=1s", "--out", str(file / "sub")]
    )
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "cannot make directory" in " ".join(result.output.split())
    result = runner.invoke(app, ["tune", "--slo", "short_chat:ttft_p95<=1s", "--out", str(file)])
    assert result.exit_code == 2, result.output
    assert file.read_text() == "keep me\n"
