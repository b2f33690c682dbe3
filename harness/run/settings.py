"""What a run's command sets, typed, from the command line to each cell.

:class:`RunSettings` holds what ``schedscope run``'s flags (or ``tune``'s confirmation)
set for every cell; :class:`CellMachine` what the command chose for one cell alone (the
fingerprint of the machine its steps run on and the cost model that prices them); a
run file's knob set may set a cell's own ``executor`` and ``torch_threads``
(harness/run/matrix.py's ``CELL_SETTINGS``). :meth:`CellSettings.for_cell` puts the
three together with the cell's profile, seed and simulator check: a cell reads nothing
else. Each default lives here once; the command line takes it from here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.processes.cpu_split import CpuSplit, auto_split
from harness.profiles import Profile, build_plan
from harness.records.redact import redact_url

if TYPE_CHECKING:
    from harness.run.matrix import Cell
    from harness.run.simulator_check import CheckModel

#: The executors a served cell may run (``schedscope serve --executor``).
EXECUTORS = ("torch", "sim")
#: Seconds a served cell's engine may take to become healthy (``--start-timeout``).
START_TIMEOUT_S = 180.0


class RunSettingsError(ValueError):
    """A setting that cannot be run; ``flag`` names the command-line flag to blame."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What the command sets for every cell of a run (engine knobs and the matrix
    aside: harness/run/plan.py)."""

    #: a served cell's ``schedscope serve --executor``: torch, or sim (sleeps the cost model)
    executor: str = "torch"
    #: the cost model file every cell shares (None: the built-in, or one per cell in
    #: :class:`CellMachine`); recorded in run.json
    cost_model: Path | None = None
    #: a served cell's ``--torch-threads`` (None: serve's default)
    torch_threads: int | None = None
    #: the served engine's and the load generator's cores (--cpu-split; None: not
    #: pinned; default: the automatic split): harness/processes/cpu_split.py
    cpu_split: CpuSplit | None = dataclasses.field(default_factory=auto_split)
    #: an external OpenAI-compatible server's base URL instead of a served engine
    target: str | None = None
    #: with ``target``: the OTLP-JSON lines file the target writes its spans to
    target_trace_file: Path | None = None
    #: with ``target``: receive its spans over OTLP/HTTP on this loopback port
    target_otlp_port: int | None = None
    #: with ``target``: receive its spans over OTLP/gRPC on this loopback port
    target_otlp_grpc_port: int | None = None
    #: the bearer token for ``target`` (never written to a file)
    api_key: str | None = None
    #: with ``target``: the knobs it was started with, in vLLM's flag names (recorded in
    #: each cell's run.json for ``calibrate --from-run``: harness/costmodel/target.py)
    target_knobs: str | None = None
    #: with ``target``: the model name sent (None: the first of its /v1/models)
    target_model: str | None = None
    #: scrape with a real Prometheus instead of reading /metrics directly
    prometheus: bool = False
    #: seconds Locust waits after the schedule for the last responses (None: each served
    #: cell's own, sized from its predicted drain: harness/run/drain.py)
    grace_s: float | None = None
    #: seconds a served engine may take to become healthy
    start_timeout_s: float = START_TIMEOUT_S
    #: the load generator's own arguments, passed to every cell's Locust
    locust_args: tuple[str, ...] = ()
    #: ``--expect-workers``: seconds Locust's master may wait for its remote workers
    #: (added to the cell's Locust deadline)
    workers_wait_s: float = 0.0
    #: ``--expect-workers``: a TOML profile's locustfile holds the profile and its files
    #: (harness/profiles/bundle.py), for workers that lack them
    ship_profile: bool = False
    #: a served cell's refit keeps the sources whose steps ran far from the pool's speed
    #: (``--keep-off-speed-sources``; else left out: harness/costmodel/evidence.py)
    keep_off_speed_sources: bool = False

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise RunSettingsError("--executor", f"{self.executor!r}: expected torch or sim")
        if self.target is not None:
            if not self.target.startswith(("http://", "https://")):
                raise RunSettingsError("--target", "expected http://HOST:PORT")
            object.__setattr__(self, "target", self.target.rstrip("/"))
        ports = (
            (self.target_otlp_port, "--target-otlp-port"),
            (self.target_otlp_grpc_port, "--target-otlp-grpc-port"),
        )
        for port, flag in ports:
            if port is not None and self.target is None:
                raise RunSettingsError(flag, "only with --target")
            if port is not None and not 0 < port < 65536:
                raise RunSettingsError(flag, f"{port}: not a TCP port (1..65535)")
        if (
            self.target_otlp_port is not None
            and self.target_otlp_port == self.target_otlp_grpc_port
        ):
            raise RunSettingsError(
                "--target-otlp-grpc-port", "OTLP/HTTP and OTLP/gRPC need ports of their own"
            )
        for value, flag in (
            (self.target_knobs, "--target-knobs"),
            (self.target_model, "--target-model"),
        ):
            if value is not None and self.target is None:
                raise RunSettingsError(flag, "only with --target")
        if self.target_knobs is not None:
            from harness.costmodel.target import TargetError, parse_knobs

            try:
                parse_knobs(self.target_knobs)
            except TargetError as exc:
                raise RunSettingsError("--target-knobs", str(exc)) from None
        if self.grace_s is not None and self.grace_s < 0:
            raise RunSettingsError("--grace", f"{self.grace_s:g}: must be >= 0")
        if self.start_timeout_s <= 0:
            raise RunSettingsError("--start-timeout", f"{self.start_timeout_s:g}: must be > 0")
        object.__setattr__(self, "locust_args", tuple(self.locust_args))

    def record(self) -> dict[str, Any]:
        """The settings as run.json keeps them: paths as text, URLs without their
        credentials, no API key."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "api_key":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, CpuSplit):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = redact_url(value) if isinstance(value, str) else value
        return out


@dataclass(frozen=True)
class CellMachine:
    """What the command chose for one cell alone: the fingerprint of the machine its
    steps run on (harness/costmodel/machine.py, as a dict) and the cost model file its
    simulated steps or sim executor read (None: the built-in)."""

    fingerprint: dict[str, Any] | None = None
    cost_model: Path | None = None


@dataclass(frozen=True, kw_only=True)
class CellSettings(RunSettings):
    """Everything one cell runs with: the run's settings with the cell's own over them,
    its profile (scaled by its rate and the run's duration scale) and seed."""

    profile_name: str
    profile: Profile
    duration_scale: float
    seed: int | None
    #: the fingerprint of the machine the cell's steps run on, for run.json and summary.json
    machine: dict[str, Any] | None = None
    #: a served cell: the model its simulator check uses, chosen at the run's start
    #: (harness/run/simulator_check.py); None: no check
    simulator_check: CheckModel | None = None
    #: an error rate above this degrades the cell (an ``error_rate`` failure, not
    #: infrastructure; the run then exits 3); None: no limit
    max_error_rate: float | None = None
    #: how the cell's ``grace_s`` was chosen (harness/run/drain.py ``Grace.to_dict``)
    grace: dict | None = None

    @classmethod
    def for_cell(
        cls,
        run: RunSettings,
        cell: Cell,
        machine: CellMachine,
        *,
        profile_name: str,
        profile: Profile,
        duration_scale: float,
        seed: int | None,
        simulator_check: CheckModel | None = None,
        max_error_rate: float | None = None,
    ) -> CellSettings:
        """``run``'s settings with the cell's own (its knob set's executor and torch
        threads, then ``machine``'s fingerprint and cost model) over them."""
        base = {f.name: getattr(run, f.name) for f in dataclasses.fields(RunSettings)}
        return cls(
            **{**base, **cell.settings, "cost_model": machine.cost_model},
            profile_name=profile_name,
            profile=profile,
            duration_scale=duration_scale,
            seed=seed,
            machine=machine.fingerprint,
            simulator_check=simulator_check,
            max_error_rate=max_error_rate,
        )

    def planned(self) -> tuple[int, float]:
        """(open-loop requests the cell's schedule sends, every turn of its sessions
        included, its duration in s)."""
        plan = build_plan(self.profile, self.seed)
        turns = sum(len(s.turns) for s in plan.sessions())
        return plan.num_open_requests + turns, plan.duration_s
