"""``--policy`` (``schedscope simulate`` and ``run``): a policy, a list, or ``all``, which
is every value of the ``scheduling_policy`` knob, lpm included."""

from __future__ import annotations

import pytest
import typer

from harness.cli.options import parse_policies
from harness.serve.knobs import build_engine_config


def test_all_is_every_policy_lpm_included():
    assert parse_policies("all") == ["fcfs", "sjf", "priority", "lpm"]


@pytest.mark.parametrize("value", ["lpm", "fcfs,lpm", "lpm, sjf"])
def test_lpm_is_a_policy_of_its_own_and_in_a_list(value):
    names = parse_policies(value)
    assert "lpm" in names
    for name in names:  # each a configuration the engine takes (serve's knob too)
        assert build_engine_config({"scheduling_policy": name}).scheduler.scheduling_policy == name


def test_an_unknown_policy_names_every_known_one():
    with pytest.raises(typer.BadParameter, match="expected fcfs, sjf, priority, lpm"):
        parse_policies("lifo")
