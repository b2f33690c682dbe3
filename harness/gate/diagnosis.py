"""Which kind of regression the gate saw: the steps got slower, the schedule got worse,
or both.

- **step cost**: a step-cost line failed (harness/gate/step_cost.py): the engine takes
  longer for the same batches.
- **scheduling**: a latency or rate line failed while every step-cost line of the cell
  passed (or the runs are simulated, where step costs are the model's): the same steps
  cost the same, so the requests waited or were batched worse.
- **both**: a step-cost line failed *and* a latency line failed by more than the step
  costs explain. What they explain is the simulator's answer: the current cell's own
  schedule simulated with a cost model fitted to each side's steps alone
  (:func:`harness.gate.step_cost.simulated_latency`) gives the latency change the step
  costs alone cause, deterministically. A TTFT or E2E line whose whole interval lies
  above that change plus its tolerance is more than slower steps.

Without step-cost lines (none configured, or sides without step records) a failed
latency line is a regression of unknown kind: the gate says so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.gate.config import STEP_COST
from harness.gate.evaluate import Check
from harness.gate.sides import Side

NONE, STEP, SCHEDULING, BOTH, UNKNOWN = "none", "step cost", "scheduling", "both", "unknown"
#: Planted faults (engine/faults.py) that make steps slower rather than schedule worse.
STEP_FAULTS = frozenset({"prefill_token_delay_s", "decode_step_delay_s", "step_slowdown"})
#: Latency lines the simulated explanation covers (rule label -> its figure's key).
EXPLAINED = {"ttft p95": "ttft_p95", "e2e p95": "e2e_p95"}


@dataclass
class Diagnosis:
    """The gate's regression kind and the lines that say why."""

    kind: str
    lines: list[str] = field(default_factory=list)
    #: cell -> class -> figure -> (from the baseline's steps, from the current's) seconds
    simulated: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "lines": self.lines, "simulated": self.simulated}


def diagnose(checks: list[Check], baseline: Side, current: Side) -> Diagnosis:
    """The kind of regression ``checks`` show (the module's rules)."""
    failed = [c for c in checks if not c.passed and not c.inconclusive]
    measured = {c.cell for c in checks if c.metric == STEP_COST and not c.inconclusive}
    # what each side's steps alone do to latency, for every cell whose steps were compared
    simulated = {cell: _simulated_figures(cell, baseline, current) for cell in sorted(measured)}
    lines = [line for cell, figures in simulated.items() if (line := _figures_line(cell, figures))]
    if not failed:
        return Diagnosis(NONE, lines, simulated)
    step_failed = {c.cell for c in failed if c.metric == STEP_COST}
    others = [c for c in failed if c.metric != STEP_COST]
    if baseline.simulated:
        slowed = sorted(
            n for side in (baseline, current) for n, c in side.cells.items()
            if set(c.faults) & STEP_FAULTS
        )  # fmt: skip
        if slowed:  # tests only: a planted step delay moves simulated step costs too
            return Diagnosis(STEP, [f"simulated with planted step delays: {', '.join(slowed)}"])
        return Diagnosis(SCHEDULING, ["simulated runs: step costs are the model's, so a "
                                      "failed line is the schedule's"])  # fmt: skip
    unexplained = [c for c in others if c.cell not in measured]
    if unexplained:
        cells = ", ".join(sorted({c.cell for c in unexplained}))
        lines.append(
            f"{cells}: no step-cost line, so the gate cannot tell slower steps from a worse "
            f'schedule there (add a [[rule]] metric = "{STEP_COST}"; docs/gate.md)'
        )
    scheduling = [c for c in others if c.cell in measured and c.cell not in step_failed]
    for c in scheduling:
        lines.append(
            f"{c.cell} {c.klass} {c.metric}: failed while the cell's steps cost the same: "
            "the schedule"
        )
    beyond: list[Check] = []
    for cell in sorted(step_failed):
        figures = simulated.get(cell) or {}
        for c in (c for c in others if c.cell == cell):
            explained = _explained_change(c, figures)
            if explained is None:
                lines.append(
                    f"{cell} {c.klass} {c.metric}: failed beside slower steps; the simulator "
                    "could not say how much of it they explain"
                )
                continue
            tolerance = c.limit or 0.0
            more = c.interval is not None and c.interval[0] > explained + tolerance
            lines.append(
                f"{cell} {c.klass} {c.metric}: {c.change:+.1%} measured; the step costs alone "
                f"explain {explained:+.1%} (the simulator, from each side's steps)"
                + ("; the rest is the schedule" if more else "")
            )
            if more:
                beyond.append(c)
    if step_failed and (scheduling or beyond):
        kind = BOTH
    elif step_failed:
        kind = STEP
    elif scheduling:
        kind = SCHEDULING
    else:
        kind = UNKNOWN
    return Diagnosis(kind, lines, simulated)


def _simulated_figures(cell: str, baseline: Side, current: Side) -> dict:
    """class -> figure -> (seconds from the baseline's step fit, from the current's), the
    current cell's schedule simulated with each (its first run's records)."""
    from harness.gate.step_cost import fit_side, read_step_runs, simulated_latency

    here, there = current.cells.get(cell), baseline.cells.get(cell)
    if here is None or there is None or not here.cell_dirs:
        return {}
    try:
        fits = [fit_side(read_step_runs(side.steps)) for side in (there, here)]
        base, cur = (simulated_latency(here.cell_dirs[0], fit) for fit in fits)
    except ValueError:  # too few steps to fit one side alone: nothing to say, no failure
        return {}
    if base is None or cur is None:
        return {}
    return {
        klass: {key: (base[klass][key], cur.get(klass, {}).get(key)) for key in base[klass]}
        for klass in base
    }


def _figures_line(cell: str, figures: dict) -> str | None:
    """One line of what the simulator derives from each side's steps, for every request;
    None without figures."""
    every = figures.get("all") or {}
    parts = []
    for key, pair in sorted(every.items()):
        if pair[0] is None or pair[1] is None or pair[0] <= 0:
            continue
        label = key.replace("_", " ")
        parts.append(f"{label} {pair[0]:.3f} s -> {pair[1]:.3f} s ({pair[1] / pair[0] - 1:+.1%})")
    if not parts:
        return None
    return (
        f"{cell}: the simulator, from each side's steps alone (baseline -> current), at this "
        f"cell's schedule: {', '.join(parts)}"
    )


def _explained_change(check: Check, figures: dict) -> float | None:
    """The relative change of ``check``'s figure between the simulations from each side's
    steps; None when the simulation has no such figure."""
    key = EXPLAINED.get(check.metric)
    pair = (figures.get(check.klass) or {}).get(key) if key else None
    if not pair or pair[0] is None or pair[1] is None or pair[0] <= 0:
        return None
    return pair[1] / pair[0] - 1
