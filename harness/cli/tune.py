"""``schedscope tune``: search the engine's knobs in the simulator for the largest load
under which every class meets its SLOs (or the best goodput), confirm the best
configurations by serving them, and write tune.json, tune.md and tune.html
(:mod:`harness.tune`; docs/tune.md)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from engine.config import ConfigError
from harness.cli import options
from harness.cli.app import console, err_console
from harness.cli.options import check_faults, choose_cost_model, writable_dir
from harness.cli.rate_scale import rate_scale_option
from harness.costmodel.machine import fingerprint
from harness.profiles import ProfileError, resolve_profile
from harness.serve.knobs import (
    build_engine_config,
    config_error,
    with_engine_knobs,
)

if TYPE_CHECKING:
    from rich.progress import Progress

#: The default --budget-s: a few hundred trials of the default profile at the default
#: --duration-scale on two cores (docs/tune.md).
DEFAULT_BUDGET_S = 240.0
#: The default --duration-scale, as `schedscope run`'s: the schedule searched is the
#: schedule served by the confirm step.
DEFAULT_DURATION_SCALE = 0.25


@with_engine_knobs()
def tune(
    context: typer.Context,
    knob_values: dict,
    profile: str = options.profile_option(),
    slo: list[str] = typer.Option(
        [],
        "--slo",
        help='A class\'s targets, e.g. "short_chat:ttft_p95<=0.5s,e2e_p99<=20s"; repeat per '
        "class. Default: each class's profile SLOs as p95 targets.",
    ),
    space: Path | None = typer.Option(
        None, "--space", help="TOML file that narrows or widens the searched knobs (docs/tune.md)."
    ),
    objective: str = typer.Option(
        "capacity",
        "--objective",
        help="capacity: the largest --rate-scale meeting every SLO; goodput: the goodput at "
        "the profile's own rate.",
    ),
    budget_s: float = typer.Option(
        DEFAULT_BUDGET_S, "--budget-s", help="Wall-clock budget of the search in seconds."
    ),
    trials: int | None = typer.Option(
        None,
        "--trials",
        help="Stop after this many trials (with --search-seed: the same result every time).",
    ),
    search_seed: int = typer.Option(0, "--search-seed", help="The sampler's seed (TPE)."),
    seed: int | None = options.seed_option(),
    duration_scale: float = options.duration_scale_option(
        DEFAULT_DURATION_SCALE, "For the search and the confirm step alike."
    ),
    workers: int = typer.Option(
        0, "--workers", help="Processes evaluating trials (0: one per CPU core)."
    ),
    batch: int = typer.Option(
        4, "--batch", help="Trials asked of the sampler at a time (part of what a seed fixes)."
    ),
    precision: float = typer.Option(
        0.05, "--precision", help="Capacity search: stop when the bracket is within this ratio."
    ),
    confirm: int = typer.Option(
        3, "--confirm", help="Serve the best K configurations and the current one (0: none)."
    ),
    confirm_executor: str = typer.Option(
        "torch", "--confirm-executor", help="The confirm cells' --executor: torch or sim."
    ),
    confirm_margin: float = typer.Option(
        0.15,
        "--confirm-margin",
        help="Serve each at its predicted capacity x (1 - m, 1, 1 + m); 0: at the capacity only.",
    ),
    confirm_extend: int = typer.Option(
        2,
        "--confirm-extend",
        help="Further rounds, one margin step beyond the rates served, for each "
        "configuration whose rates all met (or all missed) the SLOs; 0: none.",
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="Confirm against this external server (started with the winner's flags) instead "
        "of serving the bundled engine.",
    ),
    launch: str | None = typer.Option(
        None,
        "--launch",
        help="With --target: the command that starts your engine, {flags} where each "
        'configuration\'s flags go (e.g. "vllm serve MODEL --port 8000 {flags}"); every '
        "configuration confirmed is started, served and stopped in turn (docs/tune.md).",
    ),
    launch_timeout: float = typer.Option(
        600.0, "--launch-timeout", help="Seconds a launched engine may take to answer."
    ),
    rate_scale: str = rate_scale_option(
        "The search's capacities are multiples of the scaled profile; auto: of the current "
        "knobs' capacity."
    ),
    cost_model: str | None = options.cost_model_option(),
    torch_threads: int | None = options.torch_threads_option(
        "Passed to schedscope serve in the confirm step."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory for tune.json, tune.md, tune.html (default runs/tune-<time>).",
    ),
) -> None:
    """Search the scheduler's knobs for the most load every class's SLOs allow, in the
    simulator with this machine's cost model (Optuna TPE), then serve the best K and
    the current configuration to confirm; writes DIR/tune.json, tune.md, tune.html."""
    from harness.cli import rate_scale as scale_flag
    from harness.tune.objective import OBJECTIVES, Context
    from harness.tune.slo import SloError, parse_slos, profile_targets
    from harness.tune.space import Space, SpaceError, load_space

    check_faults()
    spec = scale_flag.parse(rate_scale)
    if objective not in OBJECTIVES:
        raise typer.BadParameter(f"expected {' or '.join(OBJECTIVES)}", param_hint="--objective")
    if confirm_executor not in ("torch", "sim"):
        raise typer.BadParameter("torch or sim", param_hint="--confirm-executor")
    for value, hint in ((budget_s, "--budget-s"), (duration_scale, "--duration-scale")):
        if not value > 0:
            raise typer.BadParameter("must be > 0", param_hint=hint)
    if trials is not None and trials < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--trials")
    if batch < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--batch")
    if confirm < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--confirm")
    if confirm_extend < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--confirm-extend")
    if not 0 <= confirm_margin < 1:
        raise typer.BadParameter("must be in [0, 1)", param_hint="--confirm-margin")
    if not 0 < precision < 1:
        raise typer.BadParameter("must be in (0, 1)", param_hint="--precision")
    if target and not target.startswith(("http://", "https://")):
        raise typer.BadParameter("expected http://HOST:PORT", param_hint="--target")
    if launch is not None:
        _check_launch(launch, target, launch_timeout)
    try:
        prof = resolve_profile(profile).with_duration_scale(duration_scale)
    except ProfileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None
    try:
        targets = parse_slos(slo, [c.name for c in prof.classes]) or profile_targets(prof)
    except SloError as exc:
        raise typer.BadParameter(str(exc), param_hint="--slo") from None
    if not targets:
        raise typer.BadParameter("the profile has no SLOs: give at least one", param_hint="--slo")
    try:
        chosen_space = load_space(space) if space is not None else Space()
    except SpaceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--space") from None
    target_model = options.target_cost_model(cost_model)
    if target_model is not None:
        # the target's engine is the current configuration where the user gave no knob
        knob_values = options.with_target_knobs(context, knob_values, target_model)
    elif target:
        err_console.print(
            "tune: the search simulates the bundled engine on this machine, not the engine at "
            f"{target}: `--cost-model target:NAME` (a fit of it: `schedscope calibrate "
            "--from-run` on a `schedscope run --target` of it) simulates yours",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    try:
        config = build_engine_config(knob_values)
    except ConfigError as exc:
        raise config_error(exc) from None
    _check_kv_plan(config)
    current = dict(knob_values)
    chosen_space = chosen_space.for_current(current)
    if launch is not None:
        chosen_space = _launchable(chosen_space, explicit=space is not None)
    out = writable_dir(out or _default_out())  # before the search, not after it
    choice = (
        target_model[0]
        if target_model is not None
        else choose_cost_model(cost_model, fingerprint(config.model))
    )
    chosen = None
    if spec.auto:
        name = str(choice.path or "the built-in cost model")
        chosen = scale_flag.simulated_choice(spec, prof, config, choice.model, name, seed)
    factor = chosen.factor if chosen is not None else (spec.factor or 1.0)
    if factor != 1.0:
        try:
            prof = prof.with_rate_scale(factor)
        except ProfileError as exc:
            raise typer.BadParameter(str(exc), param_hint="--rate-scale") from None
    ctx = Context(prof, seed, tuple(targets), choice.model, objective, precision)
    summary = _run(
        ctx,
        chosen_space,
        current,
        profile,
        duration_scale,
        search_seed=search_seed,
        trials=trials,
        budget_s=budget_s,
        batch=batch,
        workers=workers or os.cpu_count() or 1,
        confirm=confirm,
        confirm_settings=dict(
            executor=confirm_executor,
            cost_model=choice.path,
            torch_threads=torch_threads,
            target=target,
            margin=confirm_margin,
            extend=confirm_extend,
            base_rate_scale=factor,
            launch=launch,
            launch_timeout_s=launch_timeout,
            launch_knobs=tuple(chosen_space.names) if launch is not None else (),
        ),
        rate_scale=factor,
        rate_scale_auto=chosen.to_dict() if chosen is not None else None,
        cost_model_text=str(choice.path) if choice.path else "built-in",
        out=out,
    )
    for name, path in summary.items():
        console.print(f"{name}: {path}", soft_wrap=True, highlight=False, markup=False)


def _default_out() -> Path:
    return Path("runs") / f"tune-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _check_launch(launch: str, target: str | None, timeout_s: float) -> None:
    from harness.tune.launch import check_command

    if not target:
        raise typer.BadParameter(
            "--launch starts your engine for --target URL: give --target", param_hint="--launch"
        )
    if not timeout_s > 0:
        raise typer.BadParameter("must be > 0", param_hint="--launch-timeout")
    try:
        check_command(launch)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--launch") from None


def _launchable(space, explicit: bool):
    """The searched space cut to the knobs a launched engine takes as flags; a --space
    that names others is refused (its search would tune knobs no engine is given)."""
    from harness.tune.launch import launchable

    kept, dropped = launchable(space)
    if dropped and explicit:
        raise typer.BadParameter(
            f"--launch gives the engine vLLM's flags only; the space searches {', '.join(dropped)}"
            ": drop them (docs/tune.md)",
            param_hint="--space",
        )
    if not kept.params:
        raise typer.BadParameter(
            "nothing left to search that a launched engine takes as a flag", param_hint="--space"
        )
    if dropped:
        err_console.print(
            f"tune: --launch searches only the engine's flags; not searched: {', '.join(dropped)}",
            soft_wrap=True,
            highlight=False,
        )
    return kept


def _check_kv_plan(config) -> None:
    from engine.factory import default_kv_plan

    try:
        default_kv_plan(config)
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from None


def _run(ctx, space, current, profile_name, duration_scale, **kw) -> dict[str, Path]:
    """Search, pick the finalists, diagnose, confirm, write."""
    from harness.tune.confirm import Candidate, ConfirmSettings
    from harness.tune.confirm import confirm as confirm_candidates
    from harness.tune.diagnose import diagnose
    from harness.tune.front import pareto_front
    from harness.tune.outputs import Outcome, write_outputs
    from harness.tune.search import search

    out: Path = kw["out"]
    err_console.print(
        f"tune: {profile_name} x{duration_scale:g}, objective {ctx.objective}, "
        f"{len(space.params)} knobs searched, budget {kw['budget_s']:g} s"
        + (f" or {kw['trials']} trials" if kw["trials"] else "")
        + f", {kw['workers']} worker(s)",
        highlight=False,
        soft_wrap=True,
    )
    with _SearchProgress(kw["trials"], kw["budget_s"]) as progress:
        result = search(
            space,
            current,
            ctx,
            seed=kw["search_seed"],
            trials=kw["trials"],
            budget_s=kw["budget_s"],
            batch=kw["batch"],
            workers=kw["workers"],
            progress=progress.update,
        )
    ranked = result.ranked()
    front = pareto_front(ranked, list(ctx.targets))
    finalists: dict = {}
    good = [e for e in ranked if e.value > 0]
    for i, e in enumerate(good[: max(kw["confirm"], 1)]):
        finalists[f"c{i + 1}"] = e
    finalists["current"] = result.current
    rejected = [e for e in ranked if not e.meets_at_profile_rate and e not in finalists.values()]
    for i, e in enumerate(rejected[: max(kw["confirm"], 1)]):
        finalists[f"r{i + 1}"] = e
    traps: dict[str, list[dict]] = {}
    for label, e in finalists.items():
        if e.skipped:
            traps[label] = []
            continue
        traps[label] = diagnose(e.knobs, ctx, out / "diagnosis" / label, label)
    outcome = Outcome(
        profile=profile_name,
        duration_scale=duration_scale,
        seed=ctx.seed,
        objective=ctx.objective,
        targets=list(ctx.targets),
        space=space.describe(),
        cost_model=kw["cost_model_text"],
        search=result,
        search_seed=kw["search_seed"],
        ranked=ranked,
        front=front,
        finalists=finalists,
        traps=traps,
        rate_scale=kw["rate_scale"],
        rate_scale_auto=kw["rate_scale_auto"],
    )
    settings = ConfirmSettings(**kw["confirm_settings"])
    if kw["confirm"] > 0:
        labels = [f"c{i + 1}" for i in range(kw["confirm"]) if f"c{i + 1}" in finalists]
        if settings.target and not settings.launch:
            labels = labels[:1]  # the engine runs with one configuration: the winner's
        if (settings.launch or not settings.target) and not result.current.skipped:
            labels.append("current")
        candidates = [Candidate(label, finalists[label]) for label in labels]
        if candidates:
            outcome.confirmed, root = confirm_candidates(
                candidates,
                ctx,
                profile_name,
                duration_scale,
                settings,
                out / "confirm",
                err_console,
            )
            outcome.confirm_root = str(root)
    _print(outcome)
    return write_outputs(outcome, out)


def _print(outcome) -> None:
    from rich.console import Console
    from rich.table import Table

    from harness.tune.outputs import (
        _winner_lines,
        confirm_headers,
        confirm_lines,
        confirm_rows,
        ranked_headers,
        ranked_rows,
    )

    # Wide enough for the tables when stdout is not a terminal (as `schedscope run`).
    wide = (
        console
        if console.is_terminal
        else Console(width=max(console.width, 160), file=console.file, markup=False)
    )
    table = Table(title=f"schedscope tune — {outcome.profile}")
    for h in ranked_headers(outcome, knob_columns=False):
        table.add_column(h)
    for row in ranked_rows(outcome, limit=10, knob_columns=False):
        table.add_row(*row)
    wide.print(table)
    if outcome.search.skipped:
        console.print(
            "skipped: " + "; ".join(f"{n} x {r}" for r, n in outcome.search.skipped.most_common()),
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    for label, findings in outcome.traps.items():
        for f in findings:
            console.print(
                f"trap {f['trap']} ({label}): {f['message']}",
                soft_wrap=True,
                highlight=False,
                markup=False,
            )
    if outcome.confirmed:
        table = Table(title="predicted vs measured")
        for h in confirm_headers(outcome):
            table.add_column(h)
        for row in confirm_rows(outcome):
            table.add_row(*row)
        wide.print(table)
        for line in confirm_lines(outcome):
            console.print(line, soft_wrap=True, highlight=False, markup=False)
    for line in _winner_lines(outcome):
        console.print(line, soft_wrap=True, highlight=False, markup=False)


class _SearchProgress:
    """A rich progress bar on stderr (trials, or seconds of the budget); plain lines
    when stderr is not a terminal."""

    def __init__(self, trials: int | None, budget_s: float) -> None:
        self.trials, self.budget_s = trials, budget_s
        self.progress: Progress | None = None

    def __enter__(self):
        if err_console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            # Progress's default description column reads markup; this one does not
            columns = (
                TextColumn("{task.description}", markup=False, style="progress.description"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%", style="progress.percentage"),
                TimeRemainingColumn(),
            )
            self.progress = Progress(*columns, console=err_console, transient=True).__enter__()
            total = self.trials if self.trials else self.budget_s
            self.task = self.progress.add_task("tune", total=total)
        return self

    def update(self, done: int, result) -> None:
        best = max((e.value for e in result.trials), default=0.0)
        line = f"tune: {done} trials, best {best:.3g}, {result.elapsed_s:.0f} s"
        if self.progress is None:
            err_console.print(line, highlight=False, soft_wrap=True)
            return
        self.progress.update(
            self.task,
            completed=done if self.trials else min(result.elapsed_s, self.budget_s),
            description=line,
        )

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)
