"""``tune --target URL --launch "COMMAND {flags}"`` (harness/tune/launch.py): every
configuration confirmed is started with its own flags, served and stopped. The engine
launched is the bundled one behind ``schedscope serve --executor sim`` (the user's own
engine in the tests' place: a real server process started from the command line given,
its flags parsed by it); a command that exits is that configuration's failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.tune.launch import (
    LaunchError,
    answers,
    check_command,
    launch_flags,
    launchable,
    launched,
)
from harness.tune.space import Space, space_from_dict
from tests.support.own_store import own_store  # noqa: F401 - a fixture
from tests.support.paths import DATA
from tests.support.ports import free_port

runner = CliRunner(env={"COLUMNS": "400"})

SPACE = """base = "empty"
[params.scheduling_policy]
choices = ["fcfs", "priority"]
[params.max_num_seqs]
choices = [4, 16]
"""


def _tune_args(tmp_path, port: int, launch: str) -> list[str]:
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    return [
        "tune",
        "--profile",
        str(DATA / "tune_starvation.toml"),
        "--max-num-seqs",
        "8",
        "--space",
        str(space),
        "--slo",
        "long:ttft_p99<=8s",
        "--slo",
        "short:ttft_p99<=6s",
        "--duration-scale",
        "0.5",
        "--precision",
        "0.3",
        "--trials",
        "4",
        "--workers",
        "1",
        "--cost-model",
        "builtin",
        "--confirm",
        "1",
        "--confirm-margin",
        "0",
        "--target",
        f"http://127.0.0.1:{port}",
        "--launch",
        launch,
        "--launch-timeout",
        "90",
        "--out",
        str(tmp_path / "tune"),
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("own_store")
def test_every_configuration_is_launched_with_its_flags_served_and_stopped(tmp_path):
    port = free_port()
    command = f"{sys.executable} -m harness.cli serve --executor sim --cost-model builtin"
    result = runner.invoke(app, _tune_args(tmp_path, port, f"{command} --port {port} {{flags}}"))
    assert result.exit_code == 0, result.output
    assert not answers(f"http://127.0.0.1:{port}")  # the last engine was stopped
    tune = json.loads((tmp_path / "tune" / "tune.json").read_text())
    confirmed = tune["confirm"]["configurations"]
    assert [c["label"] for c in confirmed] == ["c1", "current"]
    winner = tune["finalists"]["c1"]["knobs"]
    for c in confirmed:
        launch = c["launch"]
        assert launch["status"] == "ok" and launch["error"] is None
        knobs = winner if c["label"] == "c1" else {"max_num_seqs": 8, "scheduling_policy": "fcfs"}
        flags = (
            f"--scheduling-policy {knobs['scheduling_policy']} "
            f"--max-num-seqs {knobs['max_num_seqs']}"
        )
        assert launch["command"] == f"{command} --port {port} {flags}"
        (rate, measured), *_ = c["measured"].items()
        assert measured["status"] == "ok" and measured["meets"] is not None
        cell = tmp_path / "tune" / "confirm" / measured["cell"]
        run = json.loads((cell / "run.json").read_text())
        assert run["mode"] == "target" and run["target_knobs"] == flags
        # the engine that answered is the one launched with these flags, as it says itself
        log = (tmp_path / "tune" / "confirm" / f"launch-{c['label']}.log").read_text()
        assert log.startswith("$ ") and flags in log.splitlines()[0]
        assert run["target_info"]["before"]["engine"] == "schedscope"
    assert f"served on `{command} --port {port}" in result.output
    # the builtin model prices the bundled engine, and the user is told so
    assert "the search simulates the bundled engine on this machine" in result.output


@pytest.mark.slow
@pytest.mark.usefixtures("own_store")
def test_a_launch_that_exits_is_that_configurations_failure(tmp_path):
    port = free_port()
    launch = f"{sys.executable} -c 'import sys; sys.exit(3)' {{flags}}"
    result = runner.invoke(app, _tune_args(tmp_path, port, launch))
    assert result.exit_code == 0, result.output
    tune = json.loads((tmp_path / "tune" / "tune.json").read_text())
    for c in tune["confirm"]["configurations"]:
        assert c["launch"]["status"] == "failed"
        assert "exited with status 3" in c["launch"]["error"]
        assert all(m["status"] == "launch failed" and m["meets"] is None
                   for m in c["measured"].values())  # fmt: skip
        assert c["measured_capacity"] is None and not c["flagged"]
    assert "launch failed" in result.output and "its engine did not start" in result.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--launch", "vllm serve M {flags}"], "give --target"),
        (["--target", "http://127.0.0.1:9", "--launch", "vllm serve M"], "{flags}"),
        (["--target", "http://127.0.0.1:9", "--launch", "vllm 'serve {flags}"], "cannot read"),
        (
            ["--target", "http://127.0.0.1:9", "--launch", "x {flags}", "--launch-timeout", "0"],
            "must be > 0",
        ),
    ],
)
def test_a_launch_that_cannot_work_is_refused_before_the_search(extra, message):
    result = runner.invoke(app, ["tune", "--profile", str(DATA / "tune_starvation.toml"), *extra])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_space_naming_knobs_no_engine_flag_sets_is_refused_with_launch(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(
        SPACE.replace('"priority"]', '"sjf"]') + "[params.max_wait_s]\nchoices=[5.0]\n"
    )
    args = ["tune", "--profile", str(DATA / "tune_starvation.toml"), "--space", str(space)]
    args += ["--target", "http://127.0.0.1:9", "--launch", "vllm serve M {flags}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "scheduling_policy=sjf" in result.output and "max_wait_s" in result.output


def test_the_default_space_keeps_only_vllm_v1_flags():
    kept, dropped = launchable(Space())
    assert kept.names == [
        "scheduling_policy",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "gpu_memory_utilization",
    ]
    assert kept.params[0].choices == ("fcfs", "priority")
    assert {"preemption_mode", "swap_space", "aging_rate", "max_wait_s"} <= set(dropped)
    only = space_from_dict({"base": "empty", "params": {"scheduling_policy": {"choices": ["sjf"]}}})
    assert launchable(only)[0].params == ()


def test_flags_spell_every_searched_knob_even_at_its_default():
    knobs = {
        "max_num_seqs": 256,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "gpu_memory_utilization": 0.9,
        "scheduling_policy": "fcfs",
        "aging_rate": 1.0,
    }
    names = ["max_num_seqs", "enable_prefix_caching", "enable_chunked_prefill"]
    names += ["gpu_memory_utilization", "scheduling_policy"]
    assert launch_flags(knobs, names) == [
        "--max-num-seqs",
        "256",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--gpu-memory-utilization",
        "0.9",
        "--scheduling-policy",
        "fcfs",
    ]
    assert check_command("vllm serve 'my model' {flags} --port 1") == [
        "vllm",
        "serve",
        "my model",
        "{flags}",
        "--port",
        "1",
    ]


def test_a_server_already_answering_is_refused_and_left_running(tmp_path):
    """Something at the URL before the launch would be measured in the engine's place."""
    (tmp_path / "health").write_text("ok")
    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while not answers(url) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(LaunchError, match="already answers"):
            with launched([sys.executable, "{flags}"], [], url, tmp_path / "log", 5):
                pass
        assert other.poll() is None
    finally:
        other.terminate()
        other.wait(10)


def test_an_engine_that_never_answers_is_stopped_at_the_timeout(tmp_path):
    port = free_port()
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    words = [sys.executable, "-c", code, "{flags}"]
    # 5 s: time enough for the child to write its pid on a busy machine
    with pytest.raises(LaunchError, match="did not answer .* within 5 s"):
        with launched(words, ["--x", "1"], f"http://127.0.0.1:{port}", tmp_path / "l.log", 5):
            pass
    assert "--x 1" in (tmp_path / "l.log").read_text()
    # stopped (and reaped) by the time the error is raised, not left sleeping
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
