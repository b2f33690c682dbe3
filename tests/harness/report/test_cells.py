"""A cell's policy and group come from what the run recorded (run.json, else the engine
config), not from parsing its directory's name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.core.sched.policy import POLICY_NAMES
from harness.report.cells import CellIdentity, baseline, cell_groups, cell_identity


def test_the_policy_is_the_one_run_json_records():
    # a directory renamed by hand names no policy; run.json still says which it ran
    assert cell_identity("baseline", {"policy": "fcfs"}, None) == CellIdentity("fcfs", "")
    assert cell_identity("sjf-big-x2", {"policy": "sjf"}, None) == CellIdentity("sjf", "-big-x2")


def test_the_group_is_the_one_run_json_records():
    # renamed by hand: the group run.json recorded still puts it beside its peers
    recorded = {"policy": "sjf", "group": "-big-x2"}
    assert cell_identity("my-sjf", recorded, None) == CellIdentity("sjf", "-big-x2")
    # not a string: read from the name as for a run written before run.json said it
    assert cell_identity("sjf-x2", {"policy": "sjf", "group": 2}, None).group == "-x2"


def test_without_run_json_the_engine_config_says_it():
    config = {"scheduler": {"scheduling_policy": "priority"}}  # EngineConfig as a dict
    assert cell_identity("priority", None, config) == CellIdentity("priority", "")
    assert cell_identity("priority-x2", {}, config) == CellIdentity("priority", "-x2")


def test_a_cell_whose_policy_is_recorded_nowhere_has_none():
    # the name alone is not evidence: "sjf-like" would have parsed as sjf
    assert cell_identity("sjf-like", {}, {}) == CellIdentity(None, "")
    assert cell_identity("sjf-like", {"policy": "no-such"}, {"scheduler": "x"}).policy is None


def test_the_baseline_of_a_group_is_its_fcfs_cell_whatever_its_name():
    cells = {
        "baseline": cell_identity("baseline", {"policy": "fcfs"}, None),
        "sjf": cell_identity("sjf", {"policy": "sjf"}, None),
        "fcfs-x2": cell_identity("fcfs-x2", {"policy": "fcfs"}, None),
        "sjf-x2": cell_identity("sjf-x2", {"policy": "sjf"}, None),
    }
    groups = cell_groups(cells)
    assert groups == {"": ["baseline", "sjf"], "-x2": ["fcfs-x2", "sjf-x2"]}
    assert baseline(groups[""], cells) == "baseline"
    assert baseline(groups["-x2"], cells) == "fcfs-x2"
    assert baseline(["sjf"], cells) is None


@given(
    st.sampled_from(sorted(POLICY_NAMES)),
    st.text(alphabet="abcxyz0123456789-", max_size=12),
)
def test_a_recorded_policy_and_its_suffix_make_the_name_back(policy, suffix):
    identity = cell_identity(policy + suffix, {"policy": policy}, None)
    assert identity.policy == policy
    assert policy + identity.group == policy + suffix
