"""``schedscope calibrate --from-run RUN_DIR ...``: a cost model of an external engine
(vLLM, SGLang, a bundled engine served elsewhere) fitted from ordinary ``schedscope run
--target`` runs against it.

What a target run collects, and what each part gives the fit:

- the client's token times per request (requests.parquet ``first_token_at`` and
  ``itl_s``): the engine's steps, rebuilt (:mod:`harness.calibration.stream_steps`),
  whose durations are fitted as the bundled engine's step cycles are
  (:func:`engine.sim.cost_fit.fit_cycles`); the steps of the run's last fifth are held
  out and score the fit;
- the requests sent to an idle engine: the client latency (their TTFT from the send
  less their one step's price);
- the target's ``/metrics`` over the run (metrics.parquet): its KV cache
  (``vllm:cache_config_info``: block size, KV blocks, prefix caching) and, for the bundled
  engine, its scheduler's knobs (``schedscope_scheduler_config_info``); a label that
  changed between scrapes is a target restarted with other knobs, refused;
- the knobs it was started with: what the run recorded (``run --target-knobs``), then
  ``calibrate --target-knobs``, in vLLM's flag names;
- ``/version`` and ``/v1/models`` as the run read them before and after its load
  (run.json ``target_info``): the engine, its version, the model.

The fit is stored under the target's fingerprint (:mod:`harness.costmodel.target`),
never this machine's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.core.cost_model import CostModel
from harness.calibration.stream_steps import (
    WINDOW_STEPS,
    StreamSteps,
    StreamStepsError,
    rebuild,
)
from harness.costmodel.target import TargetError, TargetFingerprint
from harness.costmodel.target_identity import TargetIdentity, identity

if TYPE_CHECKING:
    import polars as pl

#: The share of each run's measured steps, its last in time, held out of the fit.
HOLDOUT_SHARE = 0.2


class FromRunError(ValueError):
    """The runs cannot be fitted from; the message names the run and the reason."""


@dataclass(frozen=True)
class TargetRun:
    """One ``run --target`` cell: its directory, run.json and records."""

    path: Path
    info: dict
    requests: pl.DataFrame
    #: None when the run scraped nothing
    metrics: pl.DataFrame | None


@dataclass(frozen=True)
class TargetFit:
    model: CostModel
    identity: TargetIdentity
    lines: list[str]

    @property
    def fingerprint(self) -> TargetFingerprint:
        return self.identity.fingerprint


def target_cells(path: Path) -> list[Path]:
    """The ``--target`` cells of ``path``: itself when it is one (a run.json with a
    ``target``), else its subdirectories that are (a run directory). FromRunError says
    what ``path`` is instead."""
    own = _run_json(path / "run.json")
    if own is not None and "cell" in own:  # a cell's (a run's own lists its cells)
        if not own.get("target"):
            raise FromRunError(
                f"{path}: not a run against a --target (this engine served it here: fit "
                "its steps with --from-steps)"
            )
        return [path]
    if not path.is_dir():
        raise FromRunError(f"{path}: no such run directory")
    cells = []
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        info = _run_json(child / "run.json")
        if info is not None and info.get("target"):
            cells.append(child)
    if not cells:
        raise FromRunError(
            f"{path}: no cell of a `schedscope run --target` run here (a cell directory "
            "holds run.json with its target, and requests.parquet)"
        )
    return cells


def _run_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_run(path: Path) -> TargetRun:
    import polars as pl

    info = _run_json(path / "run.json") or {}
    try:
        requests = pl.read_parquet(path / "requests.parquet")
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise FromRunError(f"{path}: cannot read requests.parquet ({exc})") from None
    metrics = None
    if (path / "metrics.parquet").is_file():
        try:
            metrics = pl.read_parquet(path / "metrics.parquet")
        except (OSError, pl.exceptions.PolarsError):
            metrics = None
    needed = {"first_token_at", "itl_s", "prompt_tokens", "status"}
    missing = sorted(needed - set(requests.columns))
    if missing:
        raise FromRunError(f"{path}: requests.parquet lacks {missing} (docs/records.md)")
    return TargetRun(path, info, requests, metrics)


def window_size(measured_steps: int) -> int:
    """Steps per window: :data:`WINDOW_STEPS`, fewer for a short run so that it still
    gives about 100 windows to fit (ten parameters), one step each below 200 steps."""
    return max(1, min(WINDOW_STEPS, measured_steps // 100))


def _token_budget(simulate: dict) -> int:
    from engine.config import ConfigError
    from harness.serve.knobs import build_engine_config

    values = {k: v for k, v in simulate.items() if k != "scheduling_policy"}
    try:
        return build_engine_config(values).scheduler.token_budget
    except ConfigError as exc:
        raise FromRunError(f"the target's knobs do not make an engine config: {exc}") from None


def _usable_requests(run: TargetRun):
    """The run's requests, refused when none finished ok."""
    import polars as pl

    frame = run.requests
    ok = frame.filter(pl.col("status") == "ok")
    if ok.height == 0:
        counts = frame.group_by("status").len().sort("status").rows()
        said = ", ".join(f"{n} {s}" for s, n in counts) or "no rows"
        first = frame.filter(pl.col("error").is_not_null())["error"].head(1).to_list()
        why = f" (first error: {str(first[0])[:200]})" if first else ""
        raise FromRunError(f"{run.path}: no request finished ok ({said}){why}: nothing to fit")
    return frame


def client_latency(run: TargetRun, model: CostModel, steps: StreamSteps) -> list[float]:
    """The run's requests sent to an idle engine: each one's TTFT from its send less
    its step's price (the network both ways and the server's own path), in seconds."""
    out = []
    for index, features in steps.lone_prefills:
        ttft = run.requests["ttft_from_sent_s"][index]
        if ttft is None:
            continue
        out.append(float(ttft) - model.predict_features(list(features)))
    return out


def _client_latency(runs, rebuilt, fitted, simulate, knobs_text, lines) -> tuple[float, dict]:
    """The fit's client latency (and its statistics), with a line saying how it was
    found: by replaying the runs' schedules (:mod:`harness.calibration.replay_latency`),
    else from the requests sent to an idle engine, else 0."""
    from engine.config import ConfigError
    from harness.calibration.replay_latency import FIT_SHARE, replay
    from harness.costmodel.target_identity import target_policy
    from harness.serve.knobs import build_engine_config

    idle = [v for run, s in zip(runs, rebuilt, strict=True) for v in client_latency(run, fitted, s)]
    idle_s = max(0.0, float(np.median(idle))) if idle else None
    stats: dict = {"idle_sends": len(idle), "idle_send_latency_s": idle_s}
    try:
        policy = target_policy(runs[0].info, knobs_text)
        config = build_engine_config({**simulate, "scheduling_policy": policy})
        replayed = replay(runs, fitted, config)
    except (TargetError, ConfigError) as exc:
        replayed = None
        lines.append(f"the runs' schedules were not replayed: {exc}")
    if replayed is not None:
        lines += [f"not replayed: {why}" for why in replayed.skipped]
    if replayed is not None and replayed.latency_s is not None:
        stats["replay"] = {
            "latency_s": replayed.latency_s,
            "fitted_requests": replayed.fitted_requests,
            "held_out_requests": replayed.held_out_requests,
            "held_out": replayed.held_out,
        }
        held = ", ".join(
            f"{metric.replace('_s_', ' ')} {v['simulated'] * 1e3:.0f} ms vs "
            f"{v['served'] * 1e3:.0f} ms served ({v['rel_error']:+.1%})"
            for metric, v in replayed.held_out.items()
            if v["rel_error"] is not None
        )
        lines.append(
            f"client latency: {replayed.latency_s * 1e3:.2f} ms (served TTFT p50 less "
            f"simulated, over the first {FIT_SHARE:.0%} of the runs' schedules, "
            f"{replayed.fitted_requests:,} requests"
            + (f"; the idle sends alone said {idle_s * 1e3:.2f} ms" if idle_s is not None else "")
            + f"); held out, the last {1 - FIT_SHARE:.0%} ({replayed.held_out_requests:,} "
            f"requests): {held or 'nothing to score'}"
        )
        return replayed.latency_s, stats
    if idle_s is not None:
        lines.append(
            f"client latency: {idle_s * 1e3:.2f} ms (median over {len(idle)} requests sent to "
            "an idle engine: TTFT from the send less their step's price)"
        )
        return idle_s, stats
    lines.append(
        "client latency: 0 (no schedule replayed and no request sent to an idle engine: "
        "the time outside the steps is not in the fit)"
    )
    return 0.0, stats


def calibrate_from_runs(
    paths: list[Path],
    knobs_text: str | None = None,
    echo: Callable[[str], object] = print,
) -> TargetFit:
    """A cost model of the target of ``paths`` (run or cell directories of ``schedscope
    run --target``), with its fingerprint; FromRunError says why not."""
    from engine.sim.cost_fit import CalibrationError, fit_cycles
    from harness.records.generator_limited import lagging_stretches

    cells = [cell for path in paths for cell in target_cells(path)]
    runs = [read_run(cell) for cell in cells]
    identities = []
    for run in runs:
        try:
            identities.append(identity(run.info, run.metrics, knobs_text))
        except TargetError as exc:
            raise FromRunError(f"{run.path}: {exc}") from None
    first = identities[0].fingerprint
    for run, other_identity in zip(runs[1:], identities[1:], strict=True):
        other = other_identity.fingerprint
        if other.key != first.key:
            differ = [
                f"{name} {a} vs {b}"
                for name, a in first.parts().items()
                if (b := other.parts()[name]) != a
            ]
            raise FromRunError(
                f"{run.path} ran against another target than {runs[0].path} "
                f"({'; '.join(differ)}): fit them apart"
            )
    simulate = identities[0].simulate
    assumed = identities[0].assumed
    not_simulated = identities[0].not_simulated
    budget = _token_budget(simulate)
    lines = [f"target: {first.describe()}"]
    if assumed:
        lines.append(
            "assumed (the target does not say; give --target-knobs): "
            + ", ".join(f"--{k.replace('_', '-')} {simulate[k]}" for k in assumed)
        )
    if not_simulated:
        lines.append(f"the target's flags the simulation does not model: {' '.join(not_simulated)}")
    xs, ys, helds, rebuilt = [], [], [], []
    for run in runs:
        frame = _usable_requests(run)
        cached = (
            frame["cached_tokens"] if "cached_tokens" in frame.columns else [None] * frame.height
        )
        try:
            steps = rebuild(
                frame["first_token_at"],
                frame["itl_s"],
                frame["prompt_tokens"],
                cached,
                budget,
                lagging_stretches(frame),
            )
        except StreamStepsError as exc:
            raise FromRunError(f"{run.path}: {exc}") from None
        unknown = sum(1 for c in cached if c is None)
        if unknown:
            lines.append(
                f"{run.path}: {unknown:,} requests without a cached-token count were "
                "priced as computed in full (vLLM: --enable-prompt-tokens-details gives it)"
            )
        lines.append(f"{run.path}: {steps.usable_line()}")
        features, seconds, starts = steps.windows(window_size(len(steps.seconds)))
        held = np.zeros(len(seconds), dtype=bool)
        if len(held):
            held = starts > np.quantile(starts, 1 - HOLDOUT_SHARE)
        xs.append(features)
        ys.append(seconds)
        helds.append(held)
        rebuilt.append(steps)
    x, y, held = np.concatenate(xs), np.concatenate(ys), np.concatenate(helds)
    try:
        fitted = fit_cycles(
            x,
            y,
            model=first.served_model,
            source=", ".join(str(r.path) for r in runs),
            held=held,
            # windows are of like sizes: plain least squares, which queueing's total
            # time wants (weighted, the short ones' noise pulled the total low)
            power=0.0,
        )
    except CalibrationError as exc:
        raise FromRunError(f"{exc} (steps rebuilt from the streams)") from None
    latency, latency_stats = _client_latency(runs, rebuilt, fitted, simulate, knobs_text, lines)
    stats = {
        **fitted.fit,
        "method": "steps rebuilt from client token times (calibrate --from-run)",
        "holdout": f"the windows of the last {HOLDOUT_SHARE:.0%} of each run's measured steps",
        "requests": sum(s.requests for s in rebuilt),
        "streamed_requests": sum(s.streamed_requests for s in rebuilt),
        "steps_seen": sum(s.steps for s in rebuilt),
        "steps_measured": sum(len(s.seconds) for s in rebuilt),
        "windows": int(len(y)),
        "window_steps": window_size(min(len(s.seconds) for s in rebuilt)),
        "steps_not_bounded": sum(s.steps_not_bounded for s in rebuilt),
        "generator_limited_steps_left_out": sum(s.generator_limited_steps for s in rebuilt),
        "coalesced_chunks": sum(s.coalesced_chunks for s in rebuilt),
        "steps_read_late": sum(s.steps_read_late for s in rebuilt),
        **latency_stats,
    }
    model = dataclasses.replace(
        fitted,
        client_latency_s=latency,
        device=f"{first.engine} {first.version} (fitted from its streams)",
        source="from-run",
        fit=stats,
    )
    return TargetFit(model, identities[0], lines)
