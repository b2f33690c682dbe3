"""The top-level ci/ folder: the rules parse, the committed baselines are readable by
the gate, and the GitHub workflow is valid YAML whose schedscope commands exist."""

from __future__ import annotations

import re

import yaml

from harness.cli import app
from harness.gate.config import load_config
from harness.gate.gate import open_side
from tests.support.paths import REPO

CI = REPO / "ci"


def test_the_rules_parse_and_gate_simulated_runs_exactly():
    config = load_config(CI / "gate.toml")
    assert config.simulated == "exact"
    assert {r.metric for r in config.rules} >= {"ttft", "e2e", "goodput", "error_rate"}


def test_the_real_rules_gate_step_cost_and_gross_latency():
    config = load_config(CI / "gate-real.toml")
    [steps] = [r for r in config.rules if r.metric == "step_cost"]
    assert steps.max_regression is not None and steps.max_regression <= 0.1
    assert any(r.metric == "ttft" and r.max_regression for r in config.rules)


def test_the_committed_baselines_are_readable():
    simulated = open_side(CI / "baselines" / "simulated.json", "baseline")
    assert simulated.simulated and set(simulated.cells) == {"fcfs", "sjf", "priority", "lpm"}
    assert simulated.identity["profile"] == "mixed" and simulated.identity["seed"] == 7
    real = open_side(CI / "baselines" / "real-torch.json", "baseline")
    assert not real.simulated and real.identity["machine"]


def test_the_workflow_is_valid_and_its_commands_exist():
    workflow = yaml.safe_load((CI / "github" / "schedscope.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    scripts = "\n".join(step.get("run", "") for step in steps)
    commands = {
        c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands
    } | {g.name for g in app.registered_groups}
    # `.venv/bin/schedscope CMD` and `python -m harness.cli CMD` (not SCHEDSCOPE=... bash)
    used = set(re.findall(r"(?<![=/])\.venv/bin/schedscope (\w[\w-]*)", scripts)) | set(
        re.findall(r"harness\.cli (\w[\w-]*)", scripts)
    )
    assert used and used <= commands, used - commands
    assert "ci/gate-simulated.sh" in scripts and "--junit" in scripts
    assert "--config ci/gate-real.toml" in scripts and "--rate-scale auto" in scripts
    assert any("upload-artifact" in step.get("uses", "") for step in steps)
