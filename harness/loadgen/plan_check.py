"""A distributed run's workers check their plan against the master's before they send.

Each worker builds the plan from its own copy of the profile, on its own machine: an
environment variable (``replay``'s ``SCHEDSCOPE_REPLAY_TRACE``), a local file a ``.py``
profile reads, or another schedscope or numpy version can make it a different schedule,
and the split would then send neither the master's schedule nor any other. So the master
sends its plan's facts (``plan_facts``: the digest of harness.profiles.digest, the
profile's name, seed and request count) with the test start, and a worker whose own plan
has another digest raises :class:`PlanMismatch` before its first request (the start-up
probes included): it sends nothing, and its summary says why (``error``,
``plan_mismatch``).

The master turns a worker's summary with an ``error`` (a mismatch, or any exception that
stopped its run from starting) into a failure of the run: :func:`worker_failure` adds
what of the worker's share has no row, :func:`failure_message` is the line the master
prints and the ``schedscope run`` cell records.
"""

from __future__ import annotations

from harness.profiles import Plan
from harness.profiles.digest import plan_digest


class PlanMismatch(Exception):
    """This worker's plan is not the master's: ``facts`` has both (``master``, ``worker``)."""

    def __init__(self, master: dict, worker: dict) -> None:
        self.facts = {"master": master, "worker": worker}
        super().__init__(
            f"its schedule is not the master's: digest {worker['digest']} "
            f"({_describe(worker)}) against the master's {master['digest']} "
            f"({_describe(master)}); it sent no request"
        )


def plan_facts(plan: Plan) -> dict:
    """What identifies ``plan``: its digest, and the facts a person compares first."""
    return {
        "digest": plan_digest(plan),
        "profile": plan.profile.name,
        "seed": plan.seed,
        "open_requests": plan.num_open_requests,
        "sessions": len(plan.sessions()),
        "closed_phases": sum(1 for p in plan.phases if p.kind == "closed"),
    }


def check_plan(plan: Plan, master: dict | None) -> dict:
    """This worker's plan facts; raises :class:`PlanMismatch` when the master's
    (``master``; None: a master that sent none) has another digest."""
    mine = plan_facts(plan)
    if master is not None and master.get("digest") != mine["digest"]:
        raise PlanMismatch(master, mine)
    return mine


def _describe(facts: dict) -> str:
    return (
        f"profile {facts.get('profile')}, seed {facts.get('seed')}, "
        f"{facts.get('open_requests')} open-loop requests"
    )


def worker_failure(summary: dict, open_ids: list[str], received: set[str], closed_loops: int):
    """The master: ``summary`` (a worker's, with an ``error``) with what of its share (by
    the master's plan: ``open_ids``, ``closed_loops``) has no row (``missing_open``, their
    ids) and ``failed: true``."""
    missing = [i for i in open_ids if i not in received]
    return {
        **summary,
        "failed": True,
        "num_open_requests": len(open_ids),
        "num_closed_loops": closed_loops,
        "rows_received": len(received),
        "missing_open": len(missing),
        "missing_request_ids": missing,
    }


def failure_message(failure: dict) -> str:
    """One line for a process that did not run its share: its summary, with
    :func:`worker_failure`'s counts when the master knew its share."""
    name = f"worker {failure['worker']}"
    if failure.get("client_id"):
        name += f" ({failure['client_id']})"
    # a mismatch's error says it (PlanMismatch); any other stopped the run's start
    what = ":" if failure.get("plan_mismatch") else " could not start:"
    line = f"load-generator {name}{what} {failure.get('error')}"
    if "missing_open" not in failure:
        return line
    return (
        f"{line}; {failure['missing_open']} of its {failure['num_open_requests']} scheduled "
        f"open-loop requests have no record ({failure['num_closed_loops']} closed loop(s) "
        f"not run)"
    )
