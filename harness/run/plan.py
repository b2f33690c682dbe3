"""What ``schedscope run`` will run: the :class:`~harness.run.RunPlan` from its flags
(policies x the knobs at one rate scale) or from a TOML run file on top of them; against
an external ``--target``, the engine knobs are not ours to set, so one cell per rate
scale under the target's label (docs/run.md)."""

from __future__ import annotations

from pathlib import Path

from harness.run.matrix import (
    LABEL_RE,
    Cell,
    RunFileError,
    RunPlan,
    build_cells,
    load_run_file,
    repeated,
)


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
    """The run's plan; RunFileError for a bad run file, knob or ``target_label``."""
    if target_label is not None:
        check_label(target_label)
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


def check_label(label: str) -> None:
    """A ``--label`` names the target's cells, hence their directories under ``--out``:
    a name as a run file's knob set is (letters, digits, ``_ . -``, no path, at most 64
    characters), so no label writes outside ``--out`` or carries markup or markup-like text."""
    if not LABEL_RE.match(label):
        raise RunFileError(
            f"--label {label!r}: a name of letters, digits, '_', '.' and '-', starting with a "
            "letter or digit, at most 64 characters (it names the cells' directories)"
        )
