"""Finding and opening a run directory's record files (lazily).

A run directory is laid out ``RUN/<policy>/requests.parquet`` (plus ``spans``,
``steps``, ``decisions`` and ``metrics.parquet`` when present), or — a single-policy
``schedscope simulate`` — ``RUN/requests.parquet`` itself. Run information (mode,
profile, seed, each policy's engine config, duration and stall threshold) comes from
``summary.json`` (the simulator's, or a previous report's, which keeps it) and from a
run configuration file (``run.json``, ``config.json`` or ``run_config.json``) when one
is there. Nothing is required but ``requests.parquet``: what is missing is listed in
``PolicyData.missing`` and the report says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from harness.report.simulator_check import SIMULATED_DIR
from harness.speed_band import SUMMARY_KEY as SPEED_BAND_KEY
from harness.speed_band import policy_part

RECORD_FILES = ("requests", "spans", "steps", "decisions", "metrics")
OPTIONAL_FILES = ("spans", "steps", "decisions", "metrics")
RUN_CONFIG_NAMES = ("run.json", "config.json", "run_config.json")


class ReportInputError(ValueError):
    """A run directory the report cannot read at all (no requests.parquet)."""


@dataclass
class PolicyData:
    run: str  # the run's label (its directory name)
    policy: str
    path: Path
    requests: pl.LazyFrame
    spans: pl.LazyFrame | None = None
    steps: pl.LazyFrame | None = None
    decisions: pl.LazyFrame | None = None
    metrics: pl.LazyFrame | None = None
    #: The policy's entry of the run's summary.json (config, duration_s, stall_threshold_s, ...).
    info: dict = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    #: The prompts the load generator sent (the cell's run.json ``prompts``:
    #: harness/loadgen/prompt_choice.py); None when not recorded.
    prompts: dict | None = None
    #: Where requests.parquet's ``stalls`` came from (the cell's run.json
    #: ``stall_source``: harness/report/stall_causes.py); None: not recorded (the
    #: engine's or the simulator's records).
    stall_source: str | None = None
    #: An external target's server columns taken from its own spans (the cell's run.json
    #: ``server_columns_source``: {source, columns, requests_joined, requests},
    #: harness/run/target_spans.py); None: not from spans.
    server_source: dict | None = None
    #: Distributed load: workers lost mid-run, clock offsets beyond the join's tolerance
    #: (from the cell's run.json; harness/loadgen/clock.py).
    load_notes: list[str] = field(default_factory=list)
    #: A simulated policy's speed band (harness/speed_band.py): ``time_ratios``,
    #: ``sources`` and ``groups`` (class or ``all`` -> metric -> stat -> {fastest,
    #: slowest}), from its summary.json ``speed_band``; None without one.
    speed_band: dict | None = None

    @property
    def key(self) -> str:
        return f"{self.run}/{self.policy}"

    def columns(self, name: str) -> list[str]:
        frame = getattr(self, name)
        return [] if frame is None else frame.collect_schema().names()

    @property
    def config(self) -> dict:
        return self.info.get("config") or {}


@dataclass
class RunData:
    label: str
    path: Path
    policies: dict[str, PolicyData]
    info: dict = field(default_factory=dict)  # mode, profile, seed, cost_model, run config
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _run_info(root: Path, label: str) -> tuple[dict, dict[str, dict]]:
    """(run-level info, per-policy info) from summary.json and a run config file."""
    info: dict = {}
    per_policy: dict[str, dict] = {}
    summary = _read_json(root / "summary.json")
    if summary is not None:
        if "runs" in summary and isinstance(summary["runs"], dict):
            # A previous report's summary.json: it keeps the run info it read.
            run = summary["runs"].get(label) or next(iter(summary["runs"].values()), {})
            info.update({k: v for k, v in run.items() if k not in ("policies",)})
            per_policy = {
                p: dict(v.get("run_info") or {}) for p, v in (run.get("policies") or {}).items()
            }
        else:
            info.update({k: v for k, v in summary.items() if k != "policies"})
            for name, value in (summary.get("policies") or {}).items():
                per_policy[name] = {
                    k: value[k]
                    for k in (
                        "config",
                        "duration_s",
                        "stall_threshold_s",
                        "num_steps",
                        "kv_cache",
                        "tracing",
                        "step_stats",
                        "faults",
                    )
                    if k in value
                }
    for name in RUN_CONFIG_NAMES:
        config = _read_json(root / name)
        if config is not None:
            info["run_config"] = config
            info["run_config_file"] = name
            break
    return info, per_policy


def _scan(path: Path) -> pl.LazyFrame | None:
    return pl.scan_parquet(path) if path.is_file() else None


#: The cell failures of a load-generator worker (harness/run/cell.py): a ``LOAD`` line each.
WORKER_FAILURES = ("worker_plan_mismatch", "worker_failed", "worker_lost")


def _load_notes(cell_run: dict) -> list[str]:
    from harness.loadgen.clock import clock_warnings

    failures = cell_run.get("failures") or []
    workers = [f["message"] for f in failures if f.get("kind") in WORKER_FAILURES]
    return workers + clock_warnings((cell_run.get("loadgen") or {}).get("clock") or {})


def open_policy(run: str, policy: str, path: Path, info: dict) -> PolicyData:
    cell_run = _read_json(path / "run.json") or {}
    data = PolicyData(
        run=run,
        policy=policy,
        path=path,
        requests=pl.scan_parquet(path / "requests.parquet"),
        info=info,
        prompts=cell_run.get("prompts"),
        stall_source=cell_run.get("stall_source"),
        server_source=cell_run.get("server_columns_source"),
        load_notes=_load_notes(cell_run),
    )
    for name in OPTIONAL_FILES:
        frame = _scan(path / f"{name}.parquet")
        setattr(data, name, frame)
        if frame is None:
            data.missing.append(f"{name}.parquet")
    if not data.config:
        data.missing.append("engine config (summary.json or run config)")
    if data.spans is None and data.steps is None and data.decisions is None:
        columns = data.requests.collect_schema().names()
        if "queue_s" not in columns:  # no engine rows joined: an external engine
            data.missing.append(NO_ENGINE_RECORDS)
    return data


#: What a run without any engine-side record (an external engine, e.g. vLLM, that sent
#: no spans) cannot fill, said once in the report's "Missing data".
NO_ENGINE_RECORDS = (
    "no engine-side records (an external engine without spans): these sections cannot "
    "be filled and are not evidence of absence: queue wait (queue p99, queue max), "
    "preemptions (the preempt columns read –), what the engine did over each stall "
    "(its cause: unknown, external engine) and the trap diagnosis; the client-side "
    "tables, pictures and stalls are complete, "
    "and the engine's /metrics are in metrics.parquet when it was scraped. vLLM's spans "
    "fill the queue wait: --target-otlp-port or --target-otlp-grpc-port (docs/vllm.md)"
)


def open_run(root: Path | str, label: str | None = None) -> RunData:
    """Open ``root`` (one run directory) for the report."""
    root = Path(root)
    if not root.is_dir():
        raise ReportInputError(f"{root}: not a directory")
    label = label or root.resolve().name
    info, per_policy = _run_info(root, label)
    # a simulation's band: the run info keeps every key of its summary.json but policies
    run_band = info.get(SPEED_BAND_KEY)
    policies: dict[str, PolicyData] = {}
    if (root / "requests.parquet").is_file():
        names = (
            pl.scan_parquet(root / "requests.parquet")
            .select(pl.col("policy").unique())
            .collect()["policy"]
            .drop_nulls()
            .to_list()
        )
        policy = names[0] if len(names) == 1 else (next(iter(per_policy), None) or "run")
        policies[policy] = open_policy(label, policy, root, per_policy.get(policy, {}))
        policies[policy].speed_band = policy_part(run_band, policy)
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        # A served cell's simulated counterpart is part of the simulator check, not a policy.
        if child.name == SIMULATED_DIR:
            continue
        if (child / "requests.parquet").is_file():
            own = _read_json(child / "summary.json") or {}
            own_info = dict(per_policy.get(child.name, {}))
            if not own_info and child.name in (own.get("policies") or {}):
                value = own["policies"][child.name]
                own_info = {
                    k: value[k] for k in ("config", "duration_s", "stall_threshold_s") if k in value
                }
            policies[child.name] = open_policy(label, child.name, child, own_info)
            policies[child.name].speed_band = policy_part(
                own.get(SPEED_BAND_KEY), child.name
            ) or policy_part(run_band, child.name)
    if not policies:
        raise ReportInputError(
            f"{root}: no requests.parquet (expected RUN/<policy>/requests.parquet or "
            "RUN/requests.parquet)"
        )
    run = RunData(label=label, path=root, policies=policies, info=info)
    if not info:
        run.notes.append("no summary.json or run config: engine knobs and profile unknown")
    return run


def open_runs(roots: list[Path | str]) -> list[RunData]:
    """Several runs side by side, labelled by directory name (made unique if repeated)."""
    runs: list[RunData] = []
    seen: dict[str, int] = {}
    for root in roots:
        label = Path(root).resolve().name
        if label in seen:
            seen[label] += 1
            label = f"{label}-{seen[label]}"
        else:
            seen[label] = 1
        runs.append(open_run(root, label))
    return runs
