"""``schedscope simulate``: the engine's scheduler on a virtual clock, one or several
policies over one profile (:func:`harness.simulate.driver.run_simulations`), then the
comparison table (:mod:`harness.simulate.compare`)."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import ConfigError, EngineConfig
from harness.cli import options
from harness.cli.app import console
from harness.cli.options import check_faults, choose_cost_model, parse_policies
from harness.cli.rate_scale import rate_scale_option
from harness.costmodel.machine import fingerprint
from harness.profiles import Profile, ProfileError, resolve_profile
from harness.serve.knobs import build_engine_config, with_engine_knobs
from harness.simulate.compare import print_comparison, print_span_counts, print_speed_band


@with_engine_knobs(exclude=frozenset({"scheduling_policy"}))
def simulate(
    context: typer.Context,
    knob_values: dict,
    profile: str = options.profile_option(),
    policy: str = typer.Option(
        "fcfs",
        "--policy",
        help="fcfs, sjf, priority or lpm (longest cached prefix first; fcfs with prefix "
        "caching off); a comma-separated list or 'all' (every policy) compares several.",
    ),
    out: Path = typer.Option(Path("runs/simulate"), "--out", help="Directory for the records."),
    cost_model: str | None = options.cost_model_option(
        "Or target:NAME (a fit of an external engine: `schedscope calibrate --from-run`; "
        "its engine's knobs are simulated where not given)."
    ),
    seed: int | None = options.seed_option(),
    rate_scale: str = rate_scale_option(),
    duration_scale: float = options.duration_scale_option(
        1.0, "0.1: a tenth of the run; a trace keeps the arrivals inside its shortened window."
    ),
    num_requests: int | None = typer.Option(
        None,
        "--num-requests",
        help="Simulate exactly this many open-loop requests by repeating the profile's "
        "open phases.",
    ),
    write_decisions: bool = typer.Option(
        True, "--decisions/--no-decisions", help="Also write decisions.parquet."
    ),
    speed_band: bool = typer.Option(
        True,
        "--speed-band/--no-speed-band",
        help="When this machine's fit has seen its steps run at different speeds (two or "
        "more sources), also simulate at the slowest and fastest of them and print TTFT "
        "and E2E p50/p95 as a range (docs/simulator.md, 'The speed band').",
    ),
    trace_file: Path | None = typer.Option(
        None,
        "--trace-file",
        help="Write the simulated spans (OTLP-JSON lines, virtual time; docs/telemetry.md) "
        "to this file, and each policy's spans.parquet next to its records.",
    ),
) -> None:
    """Simulate the engine's scheduler on a virtual clock with a cost model.

    Writes DIR/requests.parquet, DIR/decisions.parquet and DIR/summary.json (one
    policy), or DIR/<policy>/... plus a combined DIR/summary.json (several), and
    prints a comparison table. Same profile, seed and knobs: same bytes.
    """
    from harness.cli import rate_scale as scale_flag
    from harness.simulate.driver import run_simulations

    policies = parse_policies(policy)
    check_faults()
    spec = scale_flag.parse(rate_scale)
    prof = _scaled_profile(profile, spec.factor or 1.0, duration_scale)
    target = options.target_cost_model(cost_model)
    if target is not None:
        knob_values = options.with_target_knobs(context, knob_values, target)
    configs = _policy_configs(knob_values, policies)
    first = next(iter(configs.values()))
    machine = fingerprint(first.model)
    choice = target[0] if target is not None else choose_cost_model(cost_model, machine)
    model = choice.model
    extra = None
    if spec.auto:
        chosen = scale_flag.simulated_choice(
            spec, prof, first, model, str(choice.path or "the built-in cost model"), seed
        )
        prof = _rescaled(prof, chosen.factor)
        extra = {"rate_scale_auto": chosen.to_dict()}
    if num_requests is not None and num_requests < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--num-requests")
    _check_kv_plan(next(iter(configs.values())))
    if trace_file is not None and (trace_file.is_dir() or trace_file.suffix == ".parquet"):
        raise typer.BadParameter(
            f"expected an OTLP-JSON lines file (e.g. spans.jsonl), got {trace_file}",
            param_hint="--trace-file",
        )
    summary = run_simulations(
        prof,
        configs,
        model,
        out,
        seed=seed,
        num_requests=num_requests,
        write_decisions=write_decisions,
        trace_file=trace_file,
        machine=machine.to_dict(),
        speed_band=speed_band,
        extra=extra,
    )
    print_comparison(summary, console)
    print_speed_band(summary, console)
    console.print(f"records: {out}", soft_wrap=True)
    if trace_file is not None:
        print_span_counts(summary, trace_file, console)


def _rescaled(prof: Profile, factor: float) -> Profile:
    """``prof`` at the factor ``auto`` chose; a schedule too large to run names the flag."""
    try:
        return prof.with_rate_scale(factor)
    except ProfileError as exc:
        raise typer.BadParameter(
            f"auto chose {factor:.3g}x: {exc}", param_hint="--rate-scale"
        ) from None


def _scaled_profile(profile: str, rate_scale: float, duration_scale: float) -> Profile:
    """--profile resolved, its rates and durations scaled; an error names its flag."""
    try:
        prof = resolve_profile(profile)
        if rate_scale != 1.0:
            prof = prof.with_rate_scale(rate_scale)
        if duration_scale != 1.0:
            prof = prof.with_duration_scale(duration_scale)
    except ProfileError as exc:
        hint = "--profile"
        if str(exc).startswith("rate_scale"):
            hint = "--rate-scale"
        elif str(exc).startswith("duration_scale"):
            hint = "--duration-scale"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    return prof


def _policy_configs(knob_values: dict, policies: list[str]) -> dict[str, EngineConfig]:
    """One engine config per policy: the knobs' values with its scheduling_policy."""
    configs = {}
    for name in policies:
        try:
            configs[name] = build_engine_config({**knob_values, "scheduling_policy": name})
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
    return configs


def _check_kv_plan(config: EngineConfig) -> None:
    """A bad model or memory knob, named before the simulation starts."""
    from engine.factory import default_kv_plan

    try:
        default_kv_plan(config)
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from None
