"""Finding and opening a run directory's record files (lazily).

A run directory is laid out ``RUN/<policy>/requests.parquet`` (plus ``spans``,
``steps``, ``decisions`` and ``metrics.parquet`` when present), or — a single-policy
``schedscope simulate`` — ``RUN/requests.parquet`` itself. Run information (mode,
profile, seed, each policy's engine config, duration and stall threshold) comes from
``summary.json`` (the simulator's, or a previous report's, which keeps it) and from a
run configuration file (``run.json``, ``config.json`` or ``run_config.json``) when one
is there. Nothing is required but ``requests.parquet``: what is missing is listed in
``PolicyData.missing`` and the report says so.

Every file is checked before it is used (``harness/report/validate.py``): a cell whose
``requests.parquet`` cannot be read as request records is a :class:`BrokenCell` of its
run, named with its problems and left out; an optional file that cannot be used is
listed as missing, with why; run information of the wrong shape (a ``summary.json``
whose ``policies`` is not an object, a negative ``duration_s``) is ignored, and said.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from harness.report.cells import CellIdentity, cell_identity
from harness.report.simulator_check import SIMULATED_DIR
from harness.report.validate import check_optional, check_requests, is_duration
from harness.simulate.speed_band import SUMMARY_KEY as SPEED_BAND_KEY
from harness.simulate.speed_band import policy_part

RECORD_FILES = ("requests", "spans", "steps", "decisions", "metrics")
OPTIONAL_FILES = ("spans", "steps", "decisions", "metrics")
RUN_CONFIG_NAMES = ("run.json", "config.json", "run_config.json")


class ReportInputError(ValueError):
    """A run directory the report cannot read at all (no requests.parquet), or runs of
    which no cell can be used."""


@dataclass
class BrokenCell:
    """A cell whose requests.parquet the report cannot use (harness/report/validate.py):
    left out of every table, comparison and verdict, and named with its problems."""

    run: str
    policy: str
    path: Path
    problems: list[str]

    @property
    def key(self) -> str:
        return f"{self.run}/{self.policy}"

    @property
    def text(self) -> str:
        """The file and what is wrong with it."""
        return f"{self.path / 'requests.parquet'}: " + "; ".join(self.problems)

    def line(self) -> str:
        return f"{self.key}: {self.text}: left out of the tables, comparisons and verdicts"

    def to_dict(self) -> dict:
        return {
            "run": self.run,
            "policy": self.policy,
            "path": str(self.path / "requests.parquet"),
            "problems": list(self.problems),
        }


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
    #: (from the cell's run.json; harness/loadgen/clock.py), a generator-limited load.
    load_notes: list[str] = field(default_factory=list)
    #: The load generator could not keep to the schedule (the cell's run.json
    #: ``generator_limited``): the latencies include its delay.
    generator_limited: bool = False
    #: Run info the summary.json gave in a shape the report cannot use (key -> the value,
    #: dropped from ``info``: :func:`clean_policy_info`).
    refused_info: dict = field(default_factory=dict)
    #: Which policy the cell ran and which cells it is compared with (its run.json,
    #: else its engine config: harness/report/cells.py).
    identity: CellIdentity = field(default_factory=lambda: CellIdentity(None, ""))
    #: The cell's run.json (an empty dict without one): what a command that reruns the
    #: cell reads (harness/report/diagnosis.py ``rerun_info``).
    run_json: dict = field(default_factory=dict)
    #: A simulated policy's speed band (harness/simulate/speed_band.py): ``time_ratios``,
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
    #: Cells found but not usable (named in the report, left out of it).
    broken: list[BrokenCell] = field(default_factory=list)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


#: The per-policy keys a simulator's (version 1) summary.json gives the report.
POLICY_INFO_KEYS = (
    "config",
    "duration_s",
    "stall_threshold_s",
    "num_steps",
    "kv_cache",
    "tracing",
    "step_stats",
    "faults",
)


def _objects(value, where: str, notes: list[str]) -> dict[str, dict]:
    """``value`` as name -> object, keeping only the entries that are objects; anything
    else is said in ``notes`` (a hand-edited or foreign summary.json must not stop the
    report: it only loses the info it would have given)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        notes.append(f"{where} is not an object ({type(value).__name__}): ignored")
        return {}
    kept = {k: v for k, v in value.items() if isinstance(v, dict)}
    for name in sorted(k for k, v in value.items() if not isinstance(v, dict)):
        notes.append(f"{where}.{name} is not an object: ignored")
    return kept


def _run_info(root: Path, label: str) -> tuple[dict, dict[str, dict], list[str]]:
    """(run-level info, per-policy info, notes on what was ignored) from summary.json and
    a run config file."""
    info: dict = {}
    per_policy: dict[str, dict] = {}
    notes: list[str] = []
    summary = _read_json(root / "summary.json")
    if summary is not None:
        if "runs" in summary:
            # A previous report's summary.json: it keeps the run info it read.
            runs = _objects(summary["runs"], "runs", notes)
            run = runs.get(label) or next(iter(runs.values()), {})
            info.update({k: v for k, v in run.items() if k not in ("policies",)})
            policies = _objects(run.get("policies"), "policies", notes)
            per_policy = {
                p: dict(v["run_info"]) if isinstance(v.get("run_info"), dict) else {}
                for p, v in policies.items()
            }
        else:
            info.update({k: v for k, v in summary.items() if k != "policies"})
            policies = _objects(summary.get("policies"), "policies", notes)
            for name, value in policies.items():
                per_policy[name] = {k: value[k] for k in POLICY_INFO_KEYS if k in value}
    for name in RUN_CONFIG_NAMES:
        config = _read_json(root / name)
        if config is not None:
            info["run_config"] = config
            info["run_config_file"] = name
            break
    if "profile" in info and not isinstance(info["profile"], str):
        notes.append("profile is not a string: ignored")
        del info["profile"]
    return info, per_policy, [f"{root / 'summary.json'}: {n}" for n in notes]


def clean_policy_info(info: dict) -> tuple[dict, dict, list[str]]:
    """(a policy's run info with the values the report computes with checked, the values
    refused, notes saying so): ``config`` an object, ``duration_s`` a finite duration
    >= 0, ``stall_threshold_s`` one > 0. What is not is dropped (the report then derives
    it from the rows)."""
    out, notes = dict(info), []
    refused: dict = {}
    if "config" in out and not isinstance(out["config"], dict):
        notes.append("summary.json config is not an object: engine knobs unknown")
        refused["config"] = out.pop("config")
    for key, positive in (("duration_s", False), ("stall_threshold_s", True)):
        if key not in out or out[key] is None:
            continue
        value = out[key]
        if not is_duration(value) or (positive and value == 0):
            notes.append(
                f"summary.json {key} {value!r} is not a {'positive ' if positive else ''}"
                "duration in seconds: "
                + ("computed from the rows instead" if key == "duration_s" else "not used")
            )
            refused[key] = out.pop(key)
    return out, refused, notes


#: The cell failures of a load-generator worker (harness/run/collect.py): a ``LOAD`` line each.
WORKER_FAILURES = ("worker_plan_mismatch", "worker_failed", "worker_lost")
#: The cell failure of a load generator that could not keep to the schedule (its p99
#: send lag over the limit, or requests held by the in-flight cap: harness/run/collect.py):
#: a ``LOAD`` line, and every verdict on the cell says its latencies include that delay.
GENERATOR_LIMITED = "generator_limited"
#: What the LOAD line says for a run.json that flags the cell without the failure's message.
GENERATOR_LIMITED_NOTE = "generator-limited: latencies include the generator's delay"


def _generator_limited(cell_run: dict) -> bool:
    failures = cell_run.get("failures") or []
    return cell_run.get(GENERATOR_LIMITED) is True or any(
        f.get("kind") == GENERATOR_LIMITED for f in failures
    )


def _load_notes(cell_run: dict) -> list[str]:
    from harness.loadgen.clock import clock_warnings

    failures = cell_run.get("failures") or []
    notes = [f["message"] for f in failures if f.get("kind") in WORKER_FAILURES]
    limited = [f["message"] for f in failures if f.get("kind") == GENERATOR_LIMITED]
    if not limited and _generator_limited(cell_run):
        limited = [GENERATOR_LIMITED_NOTE]
    notes += limited
    return notes + clock_warnings((cell_run.get("loadgen") or {}).get("clock") or {})


def _cell_run_json(data: PolicyData, cell_run: dict) -> None:
    """The cell's run.json fields the report shows, each kept only when it has the shape
    its writer gives it (a hand-edited run.json loses that field, and says so)."""
    from harness.loadgen.prompt_choice import PromptChoice

    where = data.path / "run.json"
    prompts = cell_run.get("prompts")
    try:
        if prompts is not None:
            PromptChoice.from_dict(prompts).line()  # what the report will print
            data.prompts = prompts
    except Exception:  # any shape the line cannot be made from
        data.missing.append(f"{where}: prompts not readable: ignored")
    source = cell_run.get("stall_source")
    data.stall_source = source if isinstance(source, str) else None
    server = cell_run.get("server_columns_source")
    if isinstance(server, dict) and {"source", "requests_joined", "requests"} <= set(server):
        data.server_source = server
    elif server is not None:
        data.missing.append(f"{where}: server_columns_source not readable: ignored")
    try:
        data.load_notes = [str(n) for n in _load_notes(cell_run)]
        data.generator_limited = _generator_limited(cell_run)
    except Exception:  # failures / loadgen.clock of another shape
        data.missing.append(f"{where}: failures or loadgen.clock not readable: ignored")


def open_policy(run: str, policy: str, path: Path, info: dict) -> PolicyData:
    """Open one cell whose requests.parquet passed its checks
    (:func:`harness.report.validate.check_requests`); its other files are checked here."""
    info, refused, notes = clean_policy_info(info)
    data = PolicyData(
        run=run,
        policy=policy,
        path=path,
        requests=pl.scan_parquet(path / "requests.parquet", glob=False),
        info=info,
        refused_info=refused,
    )
    data.missing += notes
    cell_run = _read_json(path / "run.json") or {}
    data.run_json = cell_run
    _cell_run_json(data, cell_run)
    data.identity = cell_identity(policy, cell_run, data.config)
    for name in OPTIONAL_FILES:
        file = path / f"{name}.parquet"
        problem = check_optional(file, name) if file.is_file() else "absent"
        if problem is None:
            setattr(data, name, pl.scan_parquet(file, glob=False))
        elif problem == "absent":
            data.missing.append(f"{name}.parquet")
        else:  # every section falls back as if it were absent
            data.missing.append(f"{name}.parquet ({problem}: left out)")
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


def _root_policy(root: Path, per_policy: dict[str, dict]) -> str:
    """The policy of a single-policy run's own RUN/requests.parquet: its ``policy``
    column when that holds one name, else the summary's only policy, else ``run``."""
    names: list = []
    try:
        scan = pl.scan_parquet(root / "requests.parquet", glob=False)
        if scan.collect_schema().get("policy") == pl.String:
            names = (
                scan.select(pl.col("policy").unique()).collect()["policy"].drop_nulls().to_list()
            )
    except Exception:  # an unreadable file: named by its check, under the fallback name
        names = []
    return names[0] if len(names) == 1 else (next(iter(per_policy), None) or "run")


def _cell_dirs(root: Path) -> list[Path]:
    """The directories of ``root`` that hold a cell (their own requests.parquet), and
    ``root`` itself first when it holds one."""
    cells = [root] if (root / "requests.parquet").is_file() else []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        # A served cell's simulated counterpart is part of the simulator check, not a policy.
        if child.name != SIMULATED_DIR and (child / "requests.parquet").is_file():
            cells.append(child)
    return cells


def open_run(root: Path | str, label: str | None = None) -> RunData:
    """Open ``root`` (one run directory) for the report. Its cells whose requests.parquet
    cannot be used are in ``broken``, not ``policies``."""
    root = Path(root)
    if not root.is_dir():
        raise ReportInputError(f"{root}: not a directory")
    label = label or root.resolve().name
    info, per_policy, notes = _run_info(root, label)
    # a simulation's band: the run info keeps every key of its summary.json but policies
    run_band = info.get(SPEED_BAND_KEY)
    policies: dict[str, PolicyData] = {}
    broken: list[BrokenCell] = []
    for cell in _cell_dirs(root):
        own: dict = {}
        if cell == root:
            name = _root_policy(root, per_policy)
            own_info = per_policy.get(name, {})
        else:
            name = cell.name
            own = _read_json(cell / "summary.json") or {}
            own_info = dict(per_policy.get(name, {}))
            own_policies = own.get("policies")
            if not own_info and isinstance(own_policies, dict):
                value = own_policies.get(name)
                if isinstance(value, dict):
                    own_info = {
                        k: value[k]
                        for k in ("config", "duration_s", "stall_threshold_s")
                        if k in value
                    }
        problems = check_requests(cell / "requests.parquet")
        if problems:
            broken.append(BrokenCell(label, name, cell, problems))
            continue
        policies[name] = open_policy(label, name, cell, own_info)
        own_band = policy_part(own.get(SPEED_BAND_KEY), name) if own else None
        policies[name].speed_band = own_band or policy_part(run_band, name)
    if not policies and not broken:
        raise ReportInputError(
            f"{root}: no requests.parquet (expected RUN/<policy>/requests.parquet or "
            "RUN/requests.parquet)"
        )
    run = RunData(label=label, path=root, policies=policies, info=info, broken=broken)
    run.notes += notes
    if not info:
        run.notes.append("no summary.json or run config: engine knobs and profile unknown")
    return run


def open_runs(roots: Sequence[Path | str]) -> list[RunData]:
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
