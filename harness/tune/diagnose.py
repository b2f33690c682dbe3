"""The traps (docs/traps.md) of a configuration: it is simulated at the profile's own
rate with its decisions kept, written as a ``schedscope simulate`` run directory, and
read by the report's own diagnosis (:func:`harness.report.build.build_report`,
:mod:`harness.report.diagnosis`): the same rules, thresholds and knob advice as
``schedscope report``."""

from __future__ import annotations

from pathlib import Path

from harness.serve.knobs import build_engine_config
from harness.tune.objective import Context


def diagnose(knobs: dict, ctx: Context, out: Path, name: str) -> list[dict]:
    """The trap findings of ``knobs`` at the profile's rate; the records stay in
    ``out`` (``out/<name>/requests.parquet`` ...)."""
    from harness.report.build import ReportOptions, build_report
    from harness.simulate.driver import run_simulations

    config = build_engine_config(knobs)
    run_simulations(ctx.profile, {name: config}, ctx.cost_model, out, seed=ctx.seed)
    report = build_report([out], ReportOptions(figures=False, resamples=20))
    return [
        {k: f[k] for k in ("trap", "title", "message", "knob", "evidence")}
        for rr in report.runs
        for p in rr.policies.values()
        for f in p.findings
    ]
