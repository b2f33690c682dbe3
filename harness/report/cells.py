"""Cells of a matrix run (``schedscope run --run-file``): ``<policy>[-<knob set>][-x<rate>]``.

Policies are compared within a group — the cells that share everything but the policy
(the same knob set and rate scale, hence the same arrivals) — never across groups: a
verdict between ``fcfs-x0.5`` and ``sjf-x2`` would compare different loads. A plain run
(``fcfs``, ``sjf``, ``priority``) is one group, named ``""``.
"""

from __future__ import annotations

from engine.core.sched.policy import POLICY_NAMES


def split_cell(name: str) -> tuple[str | None, str]:
    """(policy, group suffix) of a cell name; (None, name) when it names no policy."""
    for policy in sorted(POLICY_NAMES, key=len, reverse=True):
        if name == policy:
            return policy, ""
        if name.startswith(policy + "-"):
            return policy, name[len(policy) :]
    return None, name


def cell_groups(names: list[str]) -> dict[str, list[str]]:
    """Group suffix -> the cells of that group, in the given order. One group ("") when
    every name is a bare policy, or when no name carries a suffix."""
    groups: dict[str, list[str]] = {}
    for name in names:
        policy, suffix = split_cell(name)
        groups.setdefault(suffix if policy is not None else "", []).append(name)
    return groups


def baseline(group: str) -> str:
    """The FCFS cell of a group."""
    return "fcfs" + group
