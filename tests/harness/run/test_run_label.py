"""`schedscope run --label` names the target's cells, hence their directories: a label that
is a path (``../../X``, ``/abs/path``) wrote the cell outside ``--out``, and one with Rich
markup (``[/x]``) crashed the console. Labels are checked as run-file names are."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.run.matrix import RunFileError
from harness.run.plan import plan_run


@pytest.mark.parametrize(
    "label", ["../../X", "/abs/path", "[/x]", "a/b", ".hidden", "x\n", "", "a" * 65, "a b"]
)
def test_a_label_that_is_not_a_plain_name_is_a_usage_error(tmp_path, label):
    out = tmp_path / "deep" / "out"
    result = CliRunner().invoke(
        app, ["run", "--target", "http://127.0.0.1:9", "--label", label, "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "--label" in result.output
    assert list(tmp_path.rglob("*")) == []  # nothing written, inside --out or out of it


@pytest.mark.parametrize("label", ["vllm", "vllm-0.32", "my_target.v2", "A1"])
def test_plain_labels_name_the_cells(label):
    plan = plan_run(["fcfs"], {}, 1.0, "mixed", 1.0, None, target_label=label)
    assert [c.name for c in plan.cells] == [label]


def test_the_check_is_in_the_plan_so_every_caller_gets_it():
    with pytest.raises(RunFileError, match="--label"):
        plan_run(["fcfs"], {}, 1.0, "mixed", 1.0, None, target_label="../x")
