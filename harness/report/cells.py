"""Which policy each cell ran, and which cells are compared with each other.

A matrix run (``schedscope run --run-file``) names its cells
``<policy>[-<knob set>][-x<rate>][-r<k>]``. Policies are compared within a group — the
cells that share everything but the policy (the same knob set and rate scale, hence the
same arrivals) — never across groups: a verdict between ``fcfs-x0.5`` and ``sjf-x2``
would compare different loads. A plain run (``fcfs``, ``sjf``, ``priority``) is one
group, named ``""``.

A cell's policy is what its ``run.json`` records (``policy``), else its engine config's
(``summary.json``: ``config.scheduler.scheduling_policy``, all a simulation has); the name is not
parsed for it. Its group is what run.json records (``group``), else, for a run written
before run.json said it, the rest of the name after that policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.sched.policy import POLICY_NAMES

#: The policy every other one in a group is compared against.
BASELINE_POLICY = "fcfs"


@dataclass(frozen=True)
class CellIdentity:
    """``policy``: the scheduling policy the cell ran (None: not recorded anywhere);
    ``group``: the suffix its name carries after the policy ("" for a plain run, and for
    a cell whose policy is unknown)."""

    policy: str | None
    group: str


def cell_identity(name: str, run_json: dict | None, config: dict | None) -> CellIdentity:
    """The identity of cell ``name`` from its run.json, else its engine config."""
    policy = (run_json or {}).get("policy")
    if policy not in POLICY_NAMES:
        scheduler = (config or {}).get("scheduler")
        policy = scheduler.get("scheduling_policy") if isinstance(scheduler, dict) else None
    if policy not in POLICY_NAMES:
        return CellIdentity(None, "")
    group = (run_json or {}).get("group")
    if not isinstance(group, str):
        group = name[len(policy) :] if name.startswith(policy) else ""
    return CellIdentity(policy, group)


def cell_groups(cells: dict[str, CellIdentity]) -> dict[str, list[str]]:
    """Group -> the cells of that group, in the given order."""
    groups: dict[str, list[str]] = {}
    for name, identity in cells.items():
        groups.setdefault(identity.group, []).append(name)
    return groups


def baseline(names: list[str], cells: dict[str, CellIdentity]) -> str | None:
    """The FCFS cell among ``names`` (one group); None without one."""
    return next((n for n in names if cells[n].policy == BASELINE_POLICY), None)
