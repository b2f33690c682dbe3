"""The confirm step: the best configurations and the current one served for real, as
``schedscope run`` cells (:func:`harness.run.run_matrix`), each at rates around its
predicted capacity, and the simulator's predictions set beside what was measured
(docs/tune.md, "The confirm step").

Capacity objective: each configuration is served at its predicted capacity times
``1 - margin``, 1 and ``1 + margin`` (one rate when ``margin`` is 0; the profile's own
rate when nothing was predicted to meet). The measured capacity is the highest rate
served at which every class met its targets, and the true capacity lies between it and
the next rate served, which missed. A configuration whose rates all met (or all missed)
leaves its capacity open on one side, so up to ``extend`` further rounds serve it one
step of ``margin`` beyond its highest (lowest) rate, until a rate misses (meets):
without them, a simulator that was pessimistic about a configuration by any amount
read "off by -11% or less", and a comparison with that configuration proved nothing
(measured: the shipped defaults met at all three rates, 1-1.28x, on an AMD EPYC).
Served cells of those rounds live in ``extend-<i>/`` under the confirm root. Goodput
objective: the profile's own rate. A rate the simulator said meets the SLOs and the
served run missed is flagged.

``--target URL``: an external engine takes no knobs from us: the winner's flags are
printed for it (``vllm serve ...``) and the target, started with them, is served at the
winner's rates instead. With ``--launch "COMMAND {flags}"`` it does: every configuration
(the finalists and the current one) is started in turn with its flags, served at its
rates and stopped (:mod:`harness.tune.launch`); each one's rounds live under
``<label>/`` of the confirm root, and a launch that fails is that configuration's, the
others go on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from harness.loadgen.options import GRACE_S
from harness.run.matrix import Cell, RunPlan
from harness.run.settings import START_TIMEOUT_S, RunSettings
from harness.tune.objective import CAPACITY, Context, Evaluation, tails_of
from harness.tune.slo import meets

#: A served cell's status when it wrote no summary.json (it failed): unknown, neither a
#: meet nor a miss.
NO_DATA = "no data"
#: A rate's status when its configuration's engine did not start (--launch): no data.
LAUNCH_FAILED = "launch failed"


@dataclass
class Candidate:
    """One configuration to serve: its label (``c1`` .. ``cK``, ``current``), knobs and
    what the simulator predicted."""

    label: str
    evaluation: Evaluation


@dataclass
class ConfirmSettings:
    executor: str = "torch"  # the served cells' --executor (sim: fast tests)
    cost_model: Path | None = None  # what the sim executor sleeps (None: the built-in)
    torch_threads: int | None = None
    target: str | None = None
    margin: float = 0.15
    extend: int = 2  # rounds of further rates until each capacity is bracketed
    grace_s: float = GRACE_S
    start_timeout_s: float = START_TIMEOUT_S
    report: bool = True
    #: the factor the searched profile's rates already carry (``tune --rate-scale``): a
    #: confirming cell at rate r is served at r x this, its name keeps r
    base_rate_scale: float = 1.0
    #: with ``target``: the command that starts the engine, ``{flags}`` for each
    #: configuration's (harness/tune/launch.py); None: the engine is started by hand
    launch: str | None = None
    #: seconds a launched engine may take to answer at ``target``
    launch_timeout_s: float = 600.0
    #: the knobs spelled into ``{flags}`` (the searched ones)
    launch_knobs: tuple[str, ...] = ()
    #: the served run's --target-knobs (a launched configuration's flags: run.json says
    #: with what the engine ran)
    target_knobs: str | None = None

    def run_settings(self) -> RunSettings:
        """What every confirming cell runs with (harness/run/settings.py)."""
        return RunSettings(
            executor=self.executor,
            cost_model=self.cost_model,
            torch_threads=self.torch_threads,
            target=self.target,
            target_knobs=self.target_knobs,
            grace_s=self.grace_s,
            start_timeout_s=self.start_timeout_s,
        )


@dataclass
class Confirmed:
    label: str
    predicted: dict
    #: rate -> {"cell", "meets", "predicted_meets", "tails", "goodput_rps", "status"};
    #: status "no data" (the cell wrote no summary.json): ``meets`` None, unknown, left
    #: out of the capacity, its bracket and ``missed``
    measured: dict = field(default_factory=dict)
    #: The highest rate served that met every SLO (0: every rate with data missed;
    #: None: not measured, no rate served gave data, or the goodput objective).
    measured_capacity: float | None = None
    #: The lowest rate served above measured_capacity, which missed: the true capacity
    #: lies in [measured_capacity, this) (None: no rate above it was served, or it met).
    measured_capacity_below: float | None = None
    #: predicted capacity / measured capacity - 1 (None: not comparable)
    off_by: float | None = None
    #: What the served rates can tell of that error: (lowest, highest) of predicted /
    #: true capacity - 1 over the bracket; None for an end the rates leave unbounded.
    off_by_range: tuple[float | None, float | None] | None = None
    #: rates the simulator said meet the SLOs and the served run missed
    missed: list[float] = field(default_factory=list)
    traps: list[dict] = field(default_factory=list)
    #: with --launch: {"command", "status": "ok" | "failed", "error", "log"}
    launch: dict | None = None

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "predicted": self.predicted,
            "measured": {f"{r:g}": v for r, v in self.measured.items()},
            "measured_capacity": self.measured_capacity,
            "measured_capacity_below": self.measured_capacity_below,
            "off_by": self.off_by,
            "off_by_range": list(self.off_by_range) if self.off_by_range else None,
            "missed": self.missed,
            "flagged": bool(self.missed),
            "traps": self.traps,
            "launch": self.launch,
        }


def confirm_rates(evaluation: Evaluation, objective: str, margin: float) -> list[float]:
    """The rate scales a candidate is served at (module docstring)."""
    capacity = evaluation.capacity
    if objective != CAPACITY or not capacity:
        return [1.0]
    factors = (1.0,) if margin <= 0 else (1 - margin, 1.0, 1 + margin)
    return sorted({float(f"{capacity * f:.3g}") for f in factors})


def predicted_meets(rate: float, evaluation: Evaluation, objective: str) -> bool:
    """Whether the simulator said ``rate`` meets every SLO: at or below the predicted
    capacity as :func:`confirm_rates` serves it (rounded to 3 significant digits, so
    the capacity served is a rate predicted to meet), or the profile rate's verdict."""
    if objective != CAPACITY:
        return bool(evaluation.meets_at_profile_rate)
    capacity = evaluation.capacity or 0.0
    return rate <= max(capacity, float(f"{capacity:.3g}")) * (1 + 1e-9)


def extension_rate(entry: Confirmed, margin: float) -> float | None:
    """The next rate to serve a capacity candidate at, one step of ``margin`` beyond the
    rates served so far, when they leave its capacity open on one side: above the
    highest when every rate with data met, below the lowest when none did (a rate with
    no data decides nothing); None when bracketed (or nothing can tell: no margin, no
    rate with data, or a rate already too low to go on)."""
    if margin <= 0 or not entry.measured:
        return None
    rates = sorted(entry.measured)
    met = [m for r in rates if (m := entry.measured[r]["meets"]) is not None]
    if not met:
        return None
    if all(met):
        higher = float(f"{rates[-1] * (1 + margin):.3g}")
        return higher if higher > rates[-1] else None  # a margin lost to 3-digit rounding
    if not any(met):
        lower = float(f"{rates[0] * (1 - margin):.3g}")
        return lower if 0.01 <= lower < rates[0] else None
    return None


def plan_cells(
    candidates: list[Candidate],
    objective: str,
    settings: ConfirmSettings,
    rates: dict[str, list[float]] | None = None,
) -> list[tuple[Candidate, float, Cell]]:
    """(candidate, rate, cell) for every cell to serve (at ``rates[label]`` when given,
    else :func:`confirm_rates`); names ``<policy>-<label>-x<rate>``
    (``target-<label>-x<rate>`` against a --target)."""
    from harness.serve.knobs import build_engine_config

    out = []
    for cand in candidates:
        knobs = cand.evaluation.knobs
        chosen = (
            rates.get(cand.label, [])
            if rates is not None
            else confirm_rates(cand.evaluation, objective, settings.margin)
        )
        for rate in chosen:
            served_rate = rate * settings.base_rate_scale
            if settings.target:
                cell = Cell(f"target-{cand.label}-x{rate:g}", "target", cand.label, served_rate, {})
            else:
                policy = knobs["scheduling_policy"]
                cell = Cell(
                    f"{policy}-{cand.label}-x{rate:g}",
                    policy,
                    cand.label,
                    served_rate,
                    dict(knobs),
                    build_engine_config(knobs),
                    {"executor": settings.executor},
                )
            out.append((cand, rate, cell))
    return out


def confirm(
    candidates: list[Candidate],
    ctx: Context,
    profile_name: str,
    duration_scale: float,
    settings: ConfirmSettings,
    out: Path,
    console: Console,
) -> tuple[list[Confirmed], Path]:
    """Serve every candidate's cells under ``out`` (a ``schedscope run`` root; further
    rounds' under ``out/extend-<i>``) and compare. Returns the comparisons and the root."""
    results = {c.label: Confirmed(c.label, predicted(c.evaluation)) for c in candidates}
    if settings.launch:
        for cand in candidates:
            _confirm_launched(cand, results[cand.label], ctx, profile_name, duration_scale,
                              settings, out, console)  # fmt: skip
        return list(results.values()), out
    _serve_rounds(candidates, results, ctx, profile_name, duration_scale, settings, out, "",
                  console)  # fmt: skip
    return list(results.values()), out


def _serve_rounds(
    candidates: list[Candidate],
    results: dict[str, Confirmed],
    ctx: Context,
    profile_name: str,
    duration_scale: float,
    settings: ConfirmSettings,
    out: Path,
    prefix: str,
    console: Console,
) -> None:
    """The first round of ``candidates``' cells under ``out``, then the extension rounds
    under ``out/extend-<i>`` until every capacity is bracketed (or ``settings.extend``
    rounds); each cell named ``prefix`` + its path under ``out`` in ``results``."""
    planned = plan_cells(candidates, ctx.objective, settings)
    _serve_round(planned, results, ctx, profile_name, duration_scale, settings, out, prefix,
                 console)  # fmt: skip
    for cand in candidates:
        _compare(results[cand.label], ctx.objective)
    for round_ in range(1, settings.extend + 1 if ctx.objective == CAPACITY else 1):
        more = {
            cand.label: [rate]
            for cand in candidates
            if (rate := extension_rate(results[cand.label], settings.margin)) is not None
        }
        if not more:
            break
        console.print(
            "confirm: capacity not bracketed yet, serving "
            + ", ".join(f"{label} at {rates[0]:g}x" for label, rates in more.items())
        )
        planned = plan_cells(candidates, ctx.objective, settings, more)
        _serve_round(
            planned,
            results,
            ctx,
            profile_name,
            duration_scale,
            settings,
            out / f"extend-{round_}",
            f"{prefix}extend-{round_}/",
            console,
        )
        for label in more:
            _compare(results[label], ctx.objective)


def _confirm_launched(
    cand: Candidate,
    entry: Confirmed,
    ctx: Context,
    profile_name: str,
    duration_scale: float,
    settings: ConfirmSettings,
    out: Path,
    console: Console,
) -> None:
    """One configuration on the user's engine: started with its flags, served at its
    rates (and its extension rounds) under ``out/<label>/``, stopped. A launch that fails
    leaves its rates without data (status ``launch failed``), said in ``entry.launch``."""
    import shlex

    from harness.tune.launch import (
        LaunchError,
        check_command,
        launch_flags,
        launched,
        with_flags,
    )

    url, command_text = settings.target, settings.launch
    assert url is not None and command_text is not None
    words = check_command(command_text)
    flags = launch_flags(cand.evaluation.knobs, list(settings.launch_knobs))
    log = out / f"launch-{cand.label}.log"
    command = shlex.join(with_flags(words, flags))
    entry.launch = {"command": command, "status": "ok", "error": None, "log": str(log)}
    console.print(
        f"confirm: {cand.label}: launching {command}", soft_wrap=True, highlight=False, markup=False
    )
    root = out / cand.label
    settings = replace(settings, target_knobs=shlex.join(flags) if flags else None)
    try:
        with launched(words, flags, url, log, settings.launch_timeout_s):
            _serve_rounds([cand], {cand.label: entry}, ctx, profile_name, duration_scale,
                          settings, root, f"{cand.label}/", console)  # fmt: skip
    except LaunchError as exc:
        console.print(
            f"confirm: {cand.label}: launch failed: {exc}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        entry.launch = {**entry.launch, "status": "failed", "error": str(exc)}
        for rate in confirm_rates(cand.evaluation, ctx.objective, settings.margin):
            entry.measured.setdefault(
                rate,
                {"cell": None, "status": LAUNCH_FAILED, "meets": None, "tails": {},
                 "goodput_rps": None,
                 "predicted_meets": predicted_meets(rate, cand.evaluation, ctx.objective)},
            )  # fmt: skip
        _compare(entry, ctx.objective)


def _serve_round(
    planned: list[tuple[Candidate, float, Cell]],
    results: dict[str, Confirmed],
    ctx: Context,
    profile_name: str,
    duration_scale: float,
    settings: ConfirmSettings,
    out: Path,
    prefix: str,
    console: Console,
) -> None:
    """Serve ``planned`` as one ``schedscope run`` under ``out`` and add what each cell
    measured to ``results`` (its ``cell`` named relative to the confirm root)."""
    from harness.costmodel.machine import fingerprint
    from harness.run import CellMachine, RunOptions, run_matrix

    plan = RunPlan([c for _, _, c in planned], profile_name, duration_scale, ctx.seed)
    executor = "external" if settings.target else settings.executor
    machines = {
        c.name: fingerprint(
            c.config.model if c.config else "tiny",
            executor=executor,
            torch_threads=settings.torch_threads or None,
        ).to_dict()
        for _, _, c in planned
    }
    options = RunOptions(
        plan=plan,
        out=out,
        settings=settings.run_settings(),
        argv=["schedscope", "tune", "(confirm)"],
        report=settings.report,
        machine=next(iter(machines.values())),
        cell_machines={name: CellMachine(m, settings.cost_model) for name, m in machines.items()},
    )
    try:
        _, _, root = run_matrix(options, console)
    except Exception as exc:  # noqa: BLE001 - the cells' own files still say what was measured
        # The cells are served and written before the run's report; a report that
        # fails must not lose them (the comparison reads each cell's summary.json).
        console.print(f"confirm: the run's report failed ({type(exc).__name__}: {exc})")
        root = out
    findings = _findings(root)
    for cand, rate, cell in planned:
        entry = results[cand.label]
        measured = _measured(root / cell.name, cell, rate, cand.evaluation, ctx)
        measured["cell"] = prefix + cell.name
        entry.measured[rate] = measured
        entry.traps += [f for f in findings if f.get("policy") == cell.name]


def predicted(e: Evaluation) -> dict:
    return {
        "value": e.value,
        "capacity": e.capacity,
        "goodput_rps": e.goodput_rps,
        "meets_at_profile_rate": e.meets_at_profile_rate,
        "tails": e.tails,
        "tails_at_capacity": e.tails_at_capacity,
    }


def _measured(cell_dir: Path, cell: Cell, rate: float, e: Evaluation, ctx: Context) -> dict:
    """One served cell against its targets, from its summary.json."""
    from harness.records.summary import group_summary
    from harness.tune.slo import request_slos

    entry = {"cell": cell.name, "predicted_meets": predicted_meets(rate, e, ctx.objective)}
    try:
        summary = json.loads((cell_dir / "summary.json").read_text())
        policy = summary["policies"][cell.name]
    except (OSError, ValueError, KeyError):
        # unknown, not a miss: _compare and extension_rate leave it out
        return {**entry, "status": NO_DATA, "meets": None, "tails": {}, "goodput_rps": None}
    entry["meets"] = meets(list(ctx.targets), policy["classes"])
    entry["tails"] = tails_of(ctx.targets, policy["classes"])
    entry["status"] = "ok"
    try:
        import polars as pl

        frame = pl.read_parquet(cell_dir / "requests.parquet")
        profile = ctx.profile.with_rate_scale(rate) if rate != 1.0 else ctx.profile
        entry["goodput_rps"] = group_summary(
            frame, policy["duration_s"], request_slos(list(ctx.targets), profile)
        )["goodput_rps"]
    except (OSError, KeyError, pl.exceptions.PolarsError):
        entry["goodput_rps"] = policy["overall"].get("goodput_rps")
    return entry


def _compare(entry: Confirmed, objective: str) -> None:
    """The comparison of ``entry``'s rates with data (``meets`` True or False); a rate
    with no data is neither a meet nor a miss."""
    rates = sorted(entry.measured)
    known = [r for r in rates if entry.measured[r]["meets"] is not None]
    entry.missed = [
        r
        for r in known
        if entry.measured[r]["predicted_meets"] and entry.measured[r]["meets"] is False
    ]
    if objective != CAPACITY:
        measured = entry.measured[rates[0]].get("goodput_rps")
        value = entry.predicted["value"]
        entry.off_by = value / measured - 1 if measured else None
        return
    if not known:  # not measured: no capacity, no bracket, no error
        entry.measured_capacity = entry.measured_capacity_below = entry.off_by = None
        entry.off_by_range = None
        return
    meeting = [r for r in known if entry.measured[r]["meets"]]
    entry.measured_capacity = max(meeting) if meeting else 0.0
    above = [r for r in known if r > entry.measured_capacity and not entry.measured[r]["meets"]]
    entry.measured_capacity_below = min(above) if above else None
    capacity = entry.predicted["capacity"]
    entry.off_by = (
        capacity / entry.measured_capacity - 1 if entry.measured_capacity and capacity else None
    )
    if capacity:
        # true capacity in [measured, below): the error is largest at its low end
        low = (
            capacity / entry.measured_capacity_below - 1 if entry.measured_capacity_below else None
        )
        entry.off_by_range = (low, entry.off_by)


def _findings(root: Path) -> list[dict]:
    """The report's trap findings of the served run (its summary.json ``diagnosis``)."""
    try:
        summary = json.loads((root / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    if summary.get("kind") != "schedscope-report":
        return []
    return [
        {k: f.get(k) for k in ("trap", "policy", "title", "message", "knob")}
        for f in summary.get("diagnosis", [])
    ]
