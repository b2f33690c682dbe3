"""How often `schedscope gate` is wrong: false alarms and detection rates, measured.

- Simulated: the same commit simulated ``--sim-pairs`` times and gated against itself
  (every pair must pass), and each planted regression simulated once (the simulated gate
  is deterministic: it catches a planted regression every time).
- Real: short served runs (``schedscope run --policy sjf``, the torch executor, at a
  load below saturation: ``--rate-scale auto`` chosen once by the first run, then that
  factor for every run so that all share one schedule), in rounds. Each round serves a
  clean baseline first, then — in an order shuffled per round, so that no arm always
  follows the baseline — a second clean run and one run per planted regression, each
  gated against the round's baseline: the same commit against itself (false alarms),
  and each planted arm (detection). Regressions are planted with the test-only fault
  knob ``SCHEDSCOPE_FAULT`` (docs/engine.md): ``step_slowdown`` of 5%, 10% and 20% (the
  model runner's step time) and ``sjf_order=reversed`` (a broken SJF ordering: a
  scheduling change).

The gate's rules are a ``step_cost`` line at each tolerance in ``--tolerances`` and the
short class's p95 TTFT at ``--latency-tolerance`` (for gross scheduling regressions); a
pair "alarms" when the gate fails it. Printed: per arm and tolerance the alarm count,
the step-cost change and the short class's p95 TTFT change measured (medians over the
rounds), the regression kind the gate named, beside the targets (>= 90% detection at
+10%, <= 5% false alarms, one gate — its two runs and the comparison — <= 10 minutes).

Run: .venv/bin/python benchmarks/bench_gate.py [--rounds 10] [--duration-scale 0.1]
     [--sizes 0.05,0.1,0.2] [--tolerances 0,0.03,0.05] [--latency-tolerance 0.5] [--side-by-side]
     [--quick] [--work DIR [--resume]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.gate.config import parse_config
from harness.gate.gate import run_gate
from harness.gate.sides import GateInputError
from harness.records.percentiles import percentile

TARGET_FALSE_ALARMS = 0.05
AIM_FALSE_ALARMS = 0.01
TARGET_DETECTION = 0.90
#: One gate: its two runs and the comparison, seconds.
TARGET_GATE_S = 600.0
CLASS = "short_chat"
PROFILE = "mixed"
POLICY = "sjf"
SCHEDULING_ARM = "broken sjf"


def cli(*args: str, env: dict | None = None, log: Path | None = None) -> None:
    command = [sys.executable, "-m", "harness.cli", *args]
    with open(log or os.devnull, "w") as out:
        done = subprocess.run(command, env={**os.environ, **(env or {})}, stdout=out, stderr=out)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)} (log: {log})")


def short_ttft_p95(run: Path) -> float:
    frames = [pl.read_parquet(p) for p in sorted(run.glob("**/requests.parquet"))]
    rows = pl.concat(frames, how="diagonal_relaxed").filter(
        (pl.col("class") == CLASS) & (pl.col("status") == "ok")
    )
    return percentile(rows["ttft_s"].to_numpy(), 95)


def planted(sizes: list[float], sjf: bool) -> dict[str, str]:
    """Arm name -> its SCHEDSCOPE_FAULT."""
    arms = {f"+{size:.0%} steps": f"step_slowdown={size:g}" for size in sizes}
    if sjf:
        arms[SCHEDULING_ARM] = "sjf_order=reversed"
    return arms


def simulated(out: Path, fault: str, duration_scale: float, seed: int) -> Path:
    cli(
        "simulate", "--profile", PROFILE, "--policy", POLICY, "--duration-scale",
        str(duration_scale), "--seed", str(seed), "--out", str(out), "--cost-model", "builtin",
        env={"SCHEDSCOPE_FAULT": fault},
    )  # fmt: skip
    return out


def run_command(out: Path, rate_scale: str, args, split: str | None = None) -> list[str]:
    return [
        sys.executable, "-m", "harness.cli", "run", "--policy", POLICY, "--profile", PROFILE,
        "--duration-scale", str(args.duration_scale), "--seed", str(args.seed),
        "--rate-scale", rate_scale, "--no-report", "--out", str(out),
        *(["--cpu-split", split] if split else []),
    ]  # fmt: skip


def served_side_by_side(
    base: Path, other: Path, fault: str, rate_scale: str, args, swap: bool
) -> tuple[float, float]:
    """The baseline and a run with ``fault`` served at the same time on this machine:
    each server on one core, its load generator on the other (``swap``: the cores the
    other way round, so that neither side always has the same core). Returns each run's
    wall seconds."""
    cpus = sorted(os.sched_getaffinity(0))
    first, second = (cpus[1], cpus[0]) if swap else (cpus[0], cpus[1])
    walls = (base.with_suffix(".wall_s"), other.with_suffix(".wall_s"))
    if args.resume and all((p / "run.json").exists() for p in (base, other)):
        if all(w.exists() for w in walls):
            return float(walls[0].read_text()), float(walls[1].read_text())
    started = time.monotonic()
    procs = []
    for out, env, split in (
        (base, {}, f"{first}:{second}"),
        (other, {"SCHEDSCOPE_FAULT": fault}, f"{second}:{first}"),
    ):
        log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed below
        procs.append((
            subprocess.Popen(run_command(out, rate_scale, args, split),
                             env={**os.environ, "SCHEDSCOPE_FAULT": "", **env},
                             stdout=log, stderr=log),
            log, out,
        ))  # fmt: skip
    took = []
    for proc, log, out in procs:
        code = proc.wait()
        log.close()
        took.append(time.monotonic() - started)
        if code != 0:
            raise SystemExit(f"failed ({code}): run into {out} (log: {out.with_suffix('.log')})")
    for wall, seconds in zip(walls, took, strict=True):
        wall.write_text(f"{seconds}\n")
    return took[0], took[1]


def served(out: Path, fault: str, rate_scale: str, args) -> float:
    """Serves one run into ``out`` and returns its wall seconds; with ``--resume`` a run
    already there (its ``run.json`` written) is kept and its recorded time returned."""
    wall = out.with_suffix(".wall_s")
    if args.resume and (out / "run.json").exists() and wall.exists():
        return float(wall.read_text())
    started = time.monotonic()
    cli(
        "run", "--policy", POLICY, "--profile", PROFILE, "--duration-scale",
        str(args.duration_scale), "--seed", str(args.seed), "--rate-scale", rate_scale,
        "--no-report", "--out", str(out),
        env={"SCHEDSCOPE_FAULT": fault}, log=out.with_suffix(".log"),
    )  # fmt: skip
    took = time.monotonic() - started
    wall.write_text(f"{took}\n")
    return took


def chosen_scale(run: Path) -> float:
    """The absolute factor ``--rate-scale auto`` chose for ``run`` (its run.json)."""
    info = json.loads((run / "run.json").read_text())
    return float(info["rate_scale_auto"]["factor"])


def rules(step_tolerance: float | None, latency_tolerance: float) -> dict:
    out = [
        {
            "name": "short_ttft",
            "class": CLASS,
            "metric": "ttft",
            "percentile": 95,
            "max_regression": latency_tolerance,
        }
    ]
    if step_tolerance is not None:
        out.insert(0, {"name": "steps", "metric": "step_cost", "max_regression": step_tolerance})
    return {"rule": out}


def gated(baseline: Path, current: Path, tolerance: float | None, latency: float) -> dict:
    """The gate's verdict on a pair: ``alarm`` (failed; None when it refused the pair,
    exit 2, counted apart), ``kind`` (the regression kind), ``step_change``,
    ``latency_refused`` (a side was generator-limited: its latency rule refused, the
    step-cost rule alone gated) and ``s`` (the comparison's own seconds)."""
    started = time.monotonic()
    refused = False
    try:
        result = run_gate(baseline, current, parse_config(rules(tolerance, latency)))
    except GateInputError as exc:
        if tolerance is None or "generator-limited" not in str(exc):
            print(f"  refused: {exc}")
            return {"alarm": None, "kind": None, "step_change": None, "s": 0.0}
        refused = True  # the step-cost line stands without the latency rule
        only_steps = {"rule": rules(tolerance, latency)["rule"][:1]}
        result = run_gate(baseline, current, parse_config(only_steps))
    step = next((c.change for c in result.checks if c.metric == "step_cost"), None)
    return {
        "alarm": result.exit_code == 1,
        "kind": result.diagnosis.kind if result.exit_code == 1 else None,
        "step_change": step,
        "latency_refused": refused,
        "s": time.monotonic() - started,
    }


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--rounds", type=int, full=10, quick=2, help="rounds of real runs")
    parser.add_argument("--duration-scale", type=float, default=0.1)
    parser.sized("--sizes", full="0.05,0.1,0.2", quick="0.1,0.2", help="planted step slowdowns")
    parser.add_argument("--tolerances", default="0,0.03,0.05", help="step_cost tolerances")
    parser.add_argument(
        "--latency-tolerance",
        type=float,
        default=0.5,
        help="the short class's p95 TTFT rule's tolerance (gross scheduling regressions)",
    )
    parser.add_argument("--rate-scale", default="auto", help="the runs' load (auto: chosen once)")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="serve each pair's baseline and current at the same time (one core each, "
        "their load generators on the other's core, swapped every round) instead of one "
        "after the other",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.sized("--sim-pairs", type=int, full=20, quick=5, help="simulated self-pairs")
    parser.add_argument("--no-sjf", action="store_true", help="skip the broken-SJF arm")
    parser.add_argument("--work", type=Path, default=None, help="keep the runs here")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --work: keep the real runs already there (same options) and serve only "
        "the missing ones; an interrupted benchmark goes on, a finished one is re-gated",
    )
    return parser


def run(args) -> list[Figure]:
    sizes = [float(s) for s in args.sizes.split(",")]
    tolerances = [float(t) for t in args.tolerances.split(",")]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    arms = planted(sizes, not args.no_sjf)

    # Simulated: deterministic, so the same commit passes every time.
    first = simulated(work / "sim-0", "", args.duration_scale, args.seed)
    passes = sum(
        not gated(first, simulated(work / f"sim-{k}", "", args.duration_scale, args.seed),
                  None, 0.0)["alarm"]
        for k in range(1, args.sim_pairs + 1)
    )  # fmt: skip
    print(f"simulated, same commit: {passes} of {args.sim_pairs} pairs pass (target: all)")
    figures = [
        Figure("simulated, same commit: pairs passing", passes / args.sim_pairs, "", 1.0, "higher")
    ]
    base_p95 = short_ttft_p95(first)
    for name, fault in arms.items():
        out = work / f"sim-{_slug(name)}"
        verdict = gated(first, simulated(out, fault, args.duration_scale, args.seed), None, 0.0)
        change = short_ttft_p95(out) / base_p95 - 1
        print(
            f"simulated, {name} ({fault}): p95 TTFT {change:+.1%}, caught: {verdict['alarm']}"
            f" ({verdict['kind']})"
        )
        figures.append(
            Figure(f"simulated, {name}: caught", float(bool(verdict["alarm"])), "", 1.0, "higher")
        )
    if args.rounds == 0:
        return figures
    return figures + real_rounds(args, arms, tolerances, work)


def real_rounds(args, arms: dict[str, str], tolerances: list[float], work: Path) -> list[Figure]:
    """The real part (the module's docstring)."""
    rate = args.rate_scale
    pairs: dict[str, list[dict]] = {"same commit": [], **{a: [] for a in arms}}
    runs: dict[str, list[Path]] = {"clean": [], **{a: [] for a in arms}}
    seconds: list[float] = []
    gate_s: list[float] = []
    for r in range(args.rounds):
        base = work / f"r{r}-base"
        if rate.startswith("auto"):
            # the load is chosen once, by a run of its own
            served(work / "scale", "", rate, args)
            rate = f"{chosen_scale(work / 'scale'):.6g}"
            print(f"--rate-scale {args.rate_scale} chose {rate}x: every run uses it")
        order = [("same commit", "")] + list(arms.items())
        np.random.default_rng(args.seed + r).shuffle(order)
        if not args.side_by_side:
            base_s = served(base, "", rate, args)
            seconds.append(base_s)
            runs["clean"].append(base)
        for name, fault in order:
            run = work / f"r{r}-{_slug(name)}"
            if args.side_by_side:  # a baseline of its own, at the same time
                pair_base = work / f"r{r}-{_slug(name)}-base"
                base_s, took = served_side_by_side(pair_base, run, fault, rate, args, r % 2 == 1)
                seconds.append(base_s)
                runs["clean"].append(pair_base)
                # both ran at once: one gate takes the longer of the two
                gate_run_s = max(base_s, took)
            else:
                pair_base = base
                took = served(run, fault, rate, args)
                gate_run_s = base_s + took
            seconds.append(took)
            runs["clean" if name == "same commit" else name].append(run)
            verdicts = {t: gated(pair_base, run, t, args.latency_tolerance) for t in tolerances}
            # one gate of CI: the baseline's run, this run, and the comparison
            gate_s.append(gate_run_s + max(v["s"] for v in verdicts.values()))
            pairs[name].append({"run": str(run), "base": str(pair_base), "verdicts": verdicts})
        done = ", ".join(
            f"{n} {sum(bool(p['verdicts'][tolerances[0]]['alarm']) for p in v)}/{len(v)}"
            for n, v in pairs.items()
        )
        print(f"round {r + 1}/{args.rounds} (alarms at step tolerance {tolerances[0]:.0%}): {done}")
    return report(args, pairs, runs, seconds, gate_s, tolerances, work, rate)


def report(args, pairs, runs, seconds, gate_s, tolerances, work, rate) -> list[Figure]:
    clean = [short_ttft_p95(p) for p in runs["clean"]]
    clean_p95 = float(np.median(clean))
    print()
    print(
        f"real runs{' side by side' if args.side_by_side else ''}: {args.rounds} rounds, "
        f"{len(seconds)} runs of `schedscope run --policy "
        f"{POLICY} --duration-scale {args.duration_scale} --rate-scale {rate}`, "
        f"{np.median(seconds):.0f} s each (median); one gate (two runs and the comparison) "
        f"{np.median(gate_s):.0f} s (median), {max(gate_s):.0f} s at most; short-class p95 "
        f"TTFT of clean runs {clean_p95 * 1e3:.0f} ms (median), spread {min(clean) * 1e3:.0f}-"
        f"{max(clean) * 1e3:.0f} ms"
    )
    print(
        "arm".ljust(14) + "step cost".rjust(11) + "p95 TTFT".rjust(10)
        + "".join(f"alarm@{t:.0%}".rjust(11) for t in tolerances) + "  kinds named"
    )  # fmt: skip
    out: dict = {
        "rounds": args.rounds,
        "rate_scale": rate,
        "seconds_per_run": float(np.median(seconds)),
        "seconds_per_gate": float(np.median(gate_s)),
        "max_seconds_per_gate": float(max(gate_s)),
        "arms": {},
    }
    for name, entries in pairs.items():
        first = tolerances[0]
        usable = [e for e in entries if e["verdicts"][first]["alarm"] is not None]
        counts = {t: sum(bool(e["verdicts"][t]["alarm"]) for e in usable) for t in tolerances}
        steps = [e["verdicts"][first]["step_change"] for e in usable]
        step = float(np.median([s for s in steps if s is not None])) if steps else None
        ttft = np.median([short_ttft_p95(Path(e["run"])) for e in entries]) / clean_p95 - 1
        kinds: dict[str, int] = {}
        for e in usable:
            for t in tolerances:
                kind = e["verdicts"][t]["kind"]
                if kind:
                    kinds[kind] = kinds.get(kind, 0) + 1
        line = name.ljust(14) + (f"{step:+.1%}" if step is not None else "-").rjust(11)
        line += (f"{ttft:+.1%}" if name != "same commit" else "-").rjust(10)
        line += "".join(f"{counts[t]}/{len(usable)}".rjust(11) for t in tolerances)
        refused = len(entries) - len(usable)
        lagged = sum(bool(e["verdicts"][first].get("latency_refused")) for e in usable)
        print(
            line + f"  {kinds or '-'}" + (f" ({refused} refused)" if refused else "")
            + (f" ({lagged} generator-limited: step cost alone)" if lagged else "")
        )  # fmt: skip
        out["arms"][name] = {
            "step_change": step,
            "ttft_p95_change": float(ttft),
            "alarms": counts,
            "usable_pairs": len(usable),
            "refused_pairs": refused,
            "latency_refused_pairs": lagged,
            "kinds": kinds,
            "pairs": entries,
        }
    print(
        f"targets: false alarms (same commit) <= {TARGET_FALSE_ALARMS:.0%} (aim "
        f"{AIM_FALSE_ALARMS:.0%}); +10% steps caught >= {TARGET_DETECTION:.0%}; one gate "
        f"<= {TARGET_GATE_S / 60:.0f} min"
    )
    (work / "bench_gate.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"runs and results: {work}")
    figures = [
        Figure(
            "real, one gate (two runs and the comparison)",
            float(np.median(gate_s)),
            "s",
            TARGET_GATE_S,
            "lower",
            note=f"at most {max(gate_s):.0f} s",
        )  # fmt: skip
    ]
    for t in tolerances:
        for name, entry in out["arms"].items():
            n = entry["usable_pairs"]
            rate_t = entry["alarms"][t] / n if n else None
            note = f"{entry['alarms'][t]}/{n} pairs, step_cost tolerance {t:.0%}"
            if name == "same commit":
                figures.append(Figure(
                    f"real, false alarms, tolerance {t:.0%}", rate_t, "", TARGET_FALSE_ALARMS,
                    "lower", AIM_FALSE_ALARMS, note,
                ))  # fmt: skip
                continue
            target = TARGET_DETECTION if name == "+10% steps" else None
            if entry["step_change"] is not None:
                note += f", step cost measured {entry['step_change']:+.1%}"
            figures.append(Figure(
                f"real, {name} caught, tolerance {t:.0%}", rate_t, "", target, "higher", note=note
            ))  # fmt: skip
    return figures


def _slug(name: str) -> str:
    return name.replace(" ", "_").replace("%", "pct").replace("+", "")


if __name__ == "__main__":
    bench_main(parser, run)
