"""The confirm step (harness/tune/confirm.py): the winner and the current
configuration served for real as `schedscope run` cells, predicted beside measured.
Served cells take a minute (slow in tests/conftest.py; the torch executor's also
torch_model); the comparison itself is tested in test_confirm_compare.py."""

import json

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.paths import DATA

pytestmark = [pytest.mark.slow]

runner = CliRunner(env={"COLUMNS": "400"})


def _tune(tmp_path, executor: str) -> dict:
    args = [
        "tune",
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
        "0.5",
        "--precision",
        "0.3",
        "--trials",
        "6",
        "--workers",
        "1",
        "--cost-model",
        "builtin",
        "--confirm",
        "1",
        "--confirm-margin",
        "0",
        "--confirm-executor",
        executor,
        "--out",
        str(tmp_path),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "predicted vs measured" in result.output
    return json.loads((tmp_path / "tune.json").read_text())


def _check_served(tmp_path, tune: dict) -> None:
    confirm = tune["confirm"]
    labels = [c["label"] for c in confirm["configurations"]]
    assert labels == ["c1", "current"]
    for c in confirm["configurations"]:
        ((rate, measured),) = c["measured"].items()
        # a real served cell: its own directory with client records and a run.json
        cell = tmp_path / "confirm" / measured["cell"]
        assert (cell / "requests.parquet").is_file() and (cell / "run.json").is_file()
        assert measured["status"] == "ok" and measured["tails"]
        assert c["flagged"] == (measured["predicted_meets"] and not measured["meets"])
    run = json.loads((tmp_path / "confirm" / "run.json").read_text())
    assert run["mode"] == "serve"
    assert "Predicted vs measured" in (tmp_path / "tune.md").read_text()


def test_confirm_serves_the_winner_and_the_current_with_the_sim_executor(tmp_path):
    tune = _tune(tmp_path, "sim")
    _check_served(tmp_path, tune)
    run = json.loads((tmp_path / "confirm" / "run.json").read_text())
    assert {c["settings"]["executor"] for c in run["cells"]} == {"sim"}


@pytest.mark.torch_model
def test_confirm_serves_with_the_torch_executor(tmp_path):
    tune = _tune(tmp_path, "torch")
    _check_served(tmp_path, tune)
