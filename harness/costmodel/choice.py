"""Which cost model ``schedscope simulate``, ``schedscope run --simulate`` (and ``run
--executor sim``) and ``schedscope serve --executor sim`` use, and the one line on
stderr that says so (docs/simulator.md, "Which cost model"; the commands parse the flag
with :func:`harness.cli.options.choose_cost_model`).

``--cost-model``:

* not given: this machine's fit from the store (:mod:`harness.costmodel.store`) when there
  is one; else the built-in model, with a warning that it was fitted on another
  machine and the command that fixes it. A stored fit made with another schedscope
  version or other model shapes (stale) is named and not used.
* ``builtin``: the built-in model; the line says so, without the warning.
* ``auto``: this machine's fit; when there is none (or only a stale one), fit one now
  by a quick served calibration, store it and use it.
* a file: that file, as before (no line: the file is what was asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.core.cost_model import CostModel
from harness.costmodel import evidence as cost_evidence
from harness.costmodel import store as cost_store
from harness.costmodel.machine import Fingerprint

BUILTIN = "builtin"
AUTO = "auto"
#: What the built-in defaults were fitted on (engine/core/cost_model.py says how).
BUILTIN_FITTED_ON = "x86_64, 2 cores, 1 torch thread, torch 2.13 CPU build, model tiny fp32"
#: How far off the built-in model was on another machine (docs/simulator.md).
OFF_BY = "predictions here may be off by a large factor (3-4x was seen on another 2-core machine)"
FIX = "run `schedscope calibrate` to fit this machine's"


@dataclass(frozen=True)
class Choice:
    model: CostModel
    #: the file the model came from; None for the built-in
    path: Path | None
    #: the line for stderr
    line: str


def is_named_choice(value: str | None) -> bool:
    """True for the values :func:`choose` decides (not given, builtin, auto); anything
    else is a file path (``./auto`` names a file called auto)."""
    return value is None or value in (BUILTIN, AUTO)


def choose(
    value: str | None,
    fingerprint: Fingerprint,
    calibrate: Callable[[Fingerprint], CostModel] | None = None,
) -> Choice:
    """The cost model for ``value`` (None, ``builtin`` or ``auto``) on the machine of
    ``fingerprint``. ``calibrate`` fits one under ``auto`` (the commands pass
    :func:`harness.calibration.served.calibrate_quickly`)."""
    builtin = f"built-in, fitted on another machine ({BUILTIN_FITTED_ON})"
    if value == BUILTIN:
        return Choice(CostModel(), None, f"cost model: {builtin} (--cost-model builtin)")
    lookup = cost_store.find(fingerprint)
    match = lookup.match
    if match is not None and match.model is not None:
        return Choice(match.model, match.path, f"cost model: {match.path} ({_fit_facts(match)})")
    stale = ""
    if lookup.stale:
        entry = lookup.stale[-1]
        changes = (
            ", ".join(entry.fingerprint.stale_against(fingerprint)) if entry.fingerprint else ""
        )
        stale = f"{entry.path} is stale ({changes}): not used; "
    if value == AUTO:
        if calibrate is None:
            raise TypeError("--cost-model auto needs a calibrate function")
        fitted = calibrate(fingerprint)
        path = cost_store.save(fitted, fingerprint, evidence=cost_evidence.of_calibration(fitted))
        entry = cost_store.load(path)
        return Choice(
            entry.model or fitted,
            path,
            f"cost model: {stale}none fitted on this machine, so calibrated now by a "
            f"quick served calibration: {path} ({_fit_facts(entry)})",
        )
    if stale:
        return Choice(
            CostModel(),
            None,
            f"cost model: {stale}refit with `schedscope calibrate`; using the {builtin}; {OFF_BY}",
        )
    return Choice(CostModel(), None, f"cost model: {builtin}; {OFF_BY}; {FIX}")


def cell_lines(lines: dict[str, str]) -> list[str]:
    """Cell name -> its cost-model line, as the lines to print: each distinct line once,
    prefixed with the cells it is for when the cells do not all share one."""
    by_line: dict[str, list[str]] = {}
    for name, line in lines.items():
        by_line.setdefault(line, []).append(name)
    if len(by_line) <= 1:
        return list(by_line)
    return [f"{', '.join(names)}: {line}" for line, names in by_line.items()]


def _fit_facts(entry: cost_store.StoredModel) -> str:
    error = entry.holdout_error
    fitted_at = entry.model.fitted_at if entry.model else ""
    facts = (
        f"fitted on this machine{' ' + fitted_at if fitted_at else ''}, held-out median "
        f"error {'unknown' if error is None else f'{error:.1%}'}"
    )
    # A machine whose speed wanders between runs (a VM's neighbours) moves every served
    # latency by more than a fit's error: say how far its sources' steps ranged.
    speeds = cost_evidence.speed_range(entry.model.fit) if entry.model else None
    if speeds is not None:
        lowest, highest, sources = speeds
        facts += (
            f"; its {sources} sources' steps took {lowest:.2f}-{highest:.2f}x its price, "
            "so this machine's runs vary at least that much"
        )
    return facts
