"""What ``schedscope run`` will run: the :class:`~harness.run.RunPlan` from its flags
(policies x the knobs at one rate scale) or from a TOML run file on top of them; against
an external ``--target``, the engine knobs are not ours to set, so one cell per rate
scale under the target's label (docs/run.md)."""

from __future__ import annotations

from pathlib import Path

from harness.run.matrix import Cell, RunPlan, build_cells, load_run_file, repeated


def plan_run(
    policies: list[str],
    knobs: dict,
    rate_scale: float,
    profile: str,
    duration_scale: float,
    seed: int | None,
    run_file: Path | None = None,
    target_label: str | None = None,
    repeats: int = 1,
) -> RunPlan:
    """The run's plan; RunFileError for a bad run file or knob."""
    if run_file is not None:
        plan = load_run_file(
            run_file,
            knobs,
            policies,
            rate_scale,
            profile,
            duration_scale,
            seed,
            with_configs=True,
            repeats=repeats,
        )
    else:
        plan = RunPlan(
            build_cells(policies, knobs, [], [rate_scale], repeats=repeats),
            profile,
            duration_scale,
            seed,
        )
    if target_label is not None:
        rates = list(dict.fromkeys(c.rate_scale for c in plan.cells))
        rounds = max(c.repeat or 1 for c in plan.cells)
        plan.cells = repeated(
            [
                Cell(
                    name=target_label + (f"-x{r:g}" if len(rates) > 1 else ""),
                    policy=target_label,
                    knob_set=None,
                    rate_scale=r,
                    knobs={},
                    config=None,
                )
                for r in rates
            ],
            rounds,
        )
    return plan
