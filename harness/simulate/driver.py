"""Simulation: the engine's own scheduler and block manager, a cost model instead of
the model runner, a virtual clock instead of the wall clock.

The driver is a discrete-event loop: requests are added when the virtual clock
reaches their arrival; while there is work the engine steps (each step moves the
clock by its predicted duration); when there is none the clock jumps to the next
arrival. A request that arrives while a step runs joins at the step's end with its
true arrival time, so queueing delay includes the wait for the step to finish —
as it would on a real engine. Closed-loop phases keep ``concurrency`` users busy:
each sends its next request the instant the previous one ends, until the phase ends.

Everything the simulator keeps comes from the engine's step records, through the
same observer list the server and telemetry use: request rows
(``harness.records.requests.RequestRecorder``), per-step composition
(``harness.records.steps.StepLog``) and decisions.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import heapq
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from engine.core.decisions import Decision
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence, SequenceStatus
from engine.factory import build_simulated_engine
from engine.records.step_record import StepRecord
from engine.sim.decode_runs import DecodeSteps, can_start, run_decodes, supports_decode_runs
from harness.profiles import Profile, RequestSpec, build_plan, sample_requests
from harness.records.decision_log import decisions_frame
from harness.records.requests import (
    RequestRecorder,
    add_stalls,
    requests_frame,
    stall_threshold,
    unsent_record,
)
from harness.records.steps import StepLog
from harness.simulate.session_turns import SessionTurns
from harness.simulate.sim_prompts import single_turn_prompt

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine
    from engine.telemetry.tracing import Tracing, TracingSettings
    from harness.profiles import PhasePlan

#: Guard against a scheduler bug turning a simulation into an endless loop.
MAX_EMPTY_STEPS_IN_A_ROW = 10_000
#: A closed-loop user whose request was refused at once waits this long before its
#: next one, as a client honouring the server's ``Retry-After: 1`` would.
REJECTED_RETRY_AFTER_S = 1.0


class SimulationError(RuntimeError):
    pass


@dataclass
class SimulationResult:
    policy: str
    profile: str
    requests: pl.DataFrame
    decisions: list[Decision]
    duration_s: float  # virtual seconds from the start of the run (t=0) to the last completion
    num_steps: int
    stall_threshold_s: float
    kv_plan_text: str = ""
    step_stats: dict = field(default_factory=dict)
    steps: pl.DataFrame | None = None  # steps.parquet: one row per non-empty step
    #: With tracing: spans ended, exported and dropped (``Tracing.stats``).
    tracing: dict | None = None
    #: The faults planted into the simulated engine (``engine.faults``); empty: none.
    faults: dict = field(default_factory=dict)


def _pending_arrivals(profile: Profile, seed: int | None, requests: list[RequestSpec] | None):
    """Open-loop specs in time order, the closed phases of the plan and its sessions."""
    if requests is not None:
        return requests, [], []
    plan = build_plan(profile, seed)
    closed = [p for p in plan.phases if p.kind == "closed"]
    return plan.open_loop_requests(), closed, plan.sessions()


def simulate(
    profile: Profile,
    config: EngineConfig,
    cost_model: CostModel | None = None,
    seed: int | None = None,
    requests: list[RequestSpec] | None = None,
    record_decisions: bool = True,
    tracing: TracingSettings | None = None,
    truncate_trace_file: bool = True,
    fast: bool = True,
) -> SimulationResult:
    """Run ``profile`` (or an explicit list of open-loop ``requests``) through a
    simulated engine and return one record per request.

    With ``tracing``, the run's spans (virtual time: Unix time = engine time, the
    simulator's epoch is 0) go where it says; ``truncate_trace_file=False`` appends
    to its file (the next policy of a comparison). ``fast``: take the steps in which
    the scheduler has no choice as decode runs (``engine.sim.decode_runs``: the same
    records, byte for byte, in a fraction of the time); False steps the engine one
    step at a time (what the tests compare the runs with).
    """
    cost_model = cost_model or CostModel()
    engine = build_simulated_engine(config, cost_model)
    policy = config.scheduler.scheduling_policy
    open_specs, closed_phases, sessions = _pending_arrivals(profile, seed, requests)
    turns = SessionTurns(sessions, cost_model.client_latency_s)
    # Observers in this order (records, steps, decisions, then spans): each sees a step
    # record after the ones before it, as in a served engine.
    recorder, step_log = RequestRecorder(policy, profile.name), StepLog()
    engine.observers.add(recorder)
    engine.observers.add(step_log)
    decisions: list[Decision] = []
    if record_decisions:
        engine.observers.add(lambda record: decisions.extend(record.decisions))
    traced = _install_tracing(engine, tracing, truncate_trace_file)

    # Decode runs need observers that take their steps without per-sequence entries
    # for the run's members: the records, steps and decisions above; spans need every
    # step's sequences.
    runs = fast and traced is None and supports_decode_runs(engine)
    run_observers = (recorder, step_log, decisions if record_decisions else None)
    with _cyclic_gc_paused():
        arrivals = _Arrivals(open_specs, closed_phases, turns)
        _Driver(engine, arrivals, run_observers if runs else None).run()

        tracing_stats = traced.shutdown() if traced is not None else None
        rows = recorder.rows
        _add_client_latency(rows, cost_model.client_latency_s)
        _add_plan_columns(rows, arrivals.sent, turns, policy, profile.name)
        threshold = stall_threshold(_median_itl(rows))
        add_stalls(rows, threshold)
        frame = requests_frame(rows).sort("scheduled_at", "request_id")
        steps = step_log.frame()
    return SimulationResult(
        policy=policy,
        profile=profile.name,
        requests=frame,
        decisions=decisions,
        duration_s=engine.clock.now(),
        num_steps=step_log.num_steps,
        stall_threshold_s=threshold,
        kv_plan_text=engine.kv_plan.describe(config.cache.block_size),
        step_stats=step_log.summary(steps),
        steps=steps,
        tracing=tracing_stats,
        faults=engine.faults.to_dict(),
    )


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (back as it was after).

    A simulation allocates millions of objects that live to its end (requests, their
    rows, step columns) and makes no cyclic garbage (``gc.collect()`` after a run of
    100,000 requests of ``mixed`` finds none), so every full collection during it
    walks them all for nothing: about a fifth of its CPU time (docs/simulator.md,
    "Speed"). Memory is still freed by reference counting as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _install_tracing(
    engine: LLMEngine, tracing: TracingSettings | None, truncate_file: bool
) -> Tracing | None:
    """The span observer ``tracing`` asks for, added to ``engine`` last; None without
    tracing (the telemetry modules are then never imported)."""
    if tracing is None:
        return None
    from engine.telemetry.tracing import install_tracing

    return install_tracing(engine, tracing, truncate_file=truncate_file)


@functools.cache
def _sampling_params(max_tokens: int) -> SamplingParams:
    """A simulated request's sampling parameters: one (frozen) object per limit."""
    return SamplingParams(max_tokens=max_tokens)


def _add_plan_columns(
    rows: list[dict],
    sent: dict[str, RequestSpec],
    turns: SessionTurns,
    policy: str,
    profile: str,
) -> None:
    """Each row gets what its spec says and the engine does not know: its ``phase``, and
    a session turn's ``session_id`` and ``turn``; the turns never sent (their session
    ended on a failed turn) get rows that say so."""
    for row in rows:
        spec = sent[row["request_id"]]
        row["phase"] = spec.phase
        if spec.session_id is not None:
            row["session_id"], row["turn"] = spec.session_id, spec.turn
    for spec, error in turns.unsent:
        rows.append(unsent_record(spec, error, policy, profile))


def _engine_request(spec: RequestSpec, at: float, prompt: list[int] | None) -> EngineRequest:
    """``spec`` as the engine's request, arriving at engine time ``at``; ``prompt``:
    its tokens when the arrival made them (a session's turn), else its own
    (``sim_prompts``: as the load generator's, no two requests share a prefix unless
    their specs share a segment)."""
    return EngineRequest(
        spec.request_id,
        single_turn_prompt(spec) if prompt is None else prompt,
        _sampling_params(spec.max_tokens),
        arrival_time=at,
        priority=spec.priority,
        request_class=spec.class_name,
        oracle_output_tokens=spec.output_tokens,
        session_turn=spec.turn or 0,
    )


class _Arrivals:
    """The requests still to arrive: the open-loop specs (in ``scheduled_at`` order),
    the closed-loop users' next sends and the sessions' next turns (each session's
    first at its start, each later one when the turn before it has ended:
    ``session_turns.SessionTurns``).

    Users are a heap of (time, order, closed phase number): ``order`` counts pushes, so
    users due at the same instant send in the order they were queued. Each phase starts
    with ``concurrency`` users at its start; a user sends again when its request ends
    (:meth:`request_ended`), until its phase ends. On a tie the open-loop request comes
    first.
    """

    def __init__(
        self,
        open_specs: list[RequestSpec],
        closed_phases: list[PhasePlan],
        turns: SessionTurns | None = None,
    ) -> None:
        self._open = open_specs
        self._next_open = 0
        self._users: list[tuple[float, int, int]] = []
        self._order = 0
        self._phases = dict(enumerate(closed_phases))
        self._user_of: dict[str, int] = {}  # request id -> closed phase number of its user
        for phase_no, phase_plan in self._phases.items():
            assert phase_plan.concurrency is not None, "a closed phase"
            for _ in range(phase_plan.concurrency):
                self._push(phase_plan.start_s, phase_no)
        self._sessions = turns
        #: request id -> spec of every request that arrived (for the rows' plan columns)
        self.sent: dict[str, RequestSpec] = {}
        # (arrival, order, spec, prompt): sessions' turns due, first turns from the start
        self._turns: list[tuple[float, int, RequestSpec, list[int]]] = []
        if turns is not None:
            for session in turns.sessions:
                spec, prompt = turns.first_turn(session)
                self._push_turn(session.start_at, spec, prompt)

    def _push_turn(self, t: float, spec: RequestSpec, prompt: list[int]) -> None:
        heapq.heappush(self._turns, (t, self._order, spec, prompt))
        self._order += 1

    def _push(self, t: float, phase_no: int) -> None:
        heapq.heappush(self._users, (t, self._order, phase_no))
        self._order += 1

    def _open_time(self) -> float | None:
        if self._next_open < len(self._open):
            return self._open[self._next_open].scheduled_at
        return None

    def _user_time(self) -> float | None:
        return self._users[0][0] if self._users else None

    def next_time(self) -> float | None:
        """When the next request arrives; None when every request has arrived."""
        times = [t for t in (self._open_time(), self._user_time()) if t is not None]
        if self._turns:
            times.append(self._turns[0][0])
        return min(times) if times else None

    def pop_arrived(self, now: float) -> tuple[RequestSpec, float, list[int] | None] | None:
        """The next request that has arrived by ``now``, with its arrival time and its
        prompt when the arrival made it (a session's turn), taken off the queue; None
        when the next one is later (or there is none). On a tie an open-loop request
        comes first, then a closed-loop user's, then a session's turn."""
        t_open, t_user = self._open_time(), self._user_time()
        t_turn = self._turns[0][0] if self._turns else None
        if (
            t_open is not None
            and t_open <= now
            and (t_user is None or t_open <= t_user)
            and (t_turn is None or t_open <= t_turn)
        ):
            self._next_open += 1
            spec = self._open[self._next_open - 1]
            self.sent[spec.request_id] = spec
            return spec, t_open, None
        if t_user is not None and t_user <= now and (t_turn is None or t_user <= t_turn):
            t, _, phase_no = heapq.heappop(self._users)
            spec = self._phases[phase_no].next_request()
            self._user_of[spec.request_id] = phase_no
            self.sent[spec.request_id] = spec
            return spec, t, None
        if t_turn is not None and t_turn <= now:
            t, _, spec, prompt = heapq.heappop(self._turns)
            self.sent[spec.request_id] = spec
            return spec, t, prompt
        return None

    def request_ended(self, seq: Sequence, now: float) -> None:
        """``seq`` ended (at its finished time, else at engine time ``now``): a
        closed-loop user's request makes the user send its next one then, while its
        phase lasts; a session's turn, its next turn after the think time."""
        turns = self._sessions
        if turns is not None and turns.owns(seq.request_id):
            following = turns.ended(seq, now)
            if following is not None:
                self._push_turn(*following)
            return
        phase_no = self._user_of.pop(seq.request_id, None)
        if phase_no is None:
            return
        end = self._phases[phase_no].end_s
        t = seq.finished_time if seq.finished_time is not None else now
        if seq.status is SequenceStatus.FINISHED_REJECTED:
            # Re-sending at the same instant would spin without the clock moving.
            t += REJECTED_RETRY_AFTER_S
        if t < end:
            self._push(t, phase_no)


class _Driver:
    """The discrete-event loop of the module docstring, over one engine and its
    arrivals: admit what has arrived, step while there is work, else jump the virtual
    clock to the next arrival."""

    def __init__(
        self,
        engine: LLMEngine,
        arrivals: _Arrivals,
        run_observers: tuple[RequestRecorder, StepLog, list[Decision] | None] | None = None,
    ) -> None:
        """``run_observers``: the engine's request recorder, step log and decisions
        (None: not kept), to take decode runs (their steps go to these directly; the
        engine's other observers must need nothing of them: token times are applied
        by the run); None steps one step at a time."""
        self.engine = engine
        self.run_observers = run_observers
        self.clock = engine.clock
        self.arrivals = arrivals
        self.idle = 0.0  # virtual seconds with nothing to do since the last step
        self.empty_in_a_row = 0

    def run(self) -> None:
        """Until every request has arrived and the engine has no work left. Raises
        :class:`SimulationError` if the engine stops making progress."""
        while True:
            now = self.clock.now()
            self._admit_arrived(now)
            if self.engine.has_work():
                if self.run_observers is not None and can_start(self.engine):
                    self._run_decodes()
                else:
                    self._step(now)
                continue
            t_next = self.arrivals.next_time()
            if t_next is None:
                return
            self._advance_to(t_next)

    def _admit_arrived(self, now: float) -> None:
        """Add every request that has arrived by ``now``, in arrival order."""
        while (arrived := self.arrivals.pop_arrived(now)) is not None:
            self.engine.add_request(_engine_request(*arrived))

    def _step(self, now: float) -> None:
        """One engine step (``now``: the clock before it); its ended requests let their
        closed-loop users send again."""
        record: StepRecord = self.engine.step(idle_before_s=self.idle)
        self.idle = 0.0
        for seq in record.finished:
            self.arrivals.request_ended(seq, self.clock.now())
        if record.is_empty and self.engine.has_unfinished():
            self._wait_after_empty_step(record, now)
        elif not record.is_empty:
            self.empty_in_a_row = 0

    def _run_decodes(self) -> None:
        """Steps with their decodes taken as a run until a choice about the running
        requests is to be made (``engine.sim.decode_runs``), arrivals admitted as they
        fall due."""
        assert self.run_observers is not None
        steps = run_decodes(
            self.engine,
            self.arrivals.next_time,
            _RunSink(self, *self.run_observers),
            self.idle,
            self._admit_arrived,
        )
        if steps:
            self.idle = 0.0
            self.empty_in_a_row = 0
        else:
            self._step(self.clock.now())

    def _wait_after_empty_step(self, record: StepRecord, now: float) -> None:
        """An empty step with requests unfinished (e.g. a static batch forming): move
        the clock to the engine's wake time or the next arrival, whichever is first."""
        self.empty_in_a_row += 1
        if self.empty_in_a_row > MAX_EMPTY_STEPS_IN_A_ROW:
            raise SimulationError(
                f"engine made no progress for {self.empty_in_a_row} steps at t={now}"
            )
        targets = [t for t in (record.wake_at, self.arrivals.next_time()) if t is not None]
        if not targets:
            raise SimulationError(f"engine idle with unfinished requests at t={now}")
        self._advance_to(min(targets))

    def _advance_to(self, t: float) -> None:
        """Move the clock to ``t``; the time skipped is idle time of the next step."""
        before = self.clock.now()
        self.clock.advance_to(t)
        self.idle += self.clock.now() - before


class _RunSink:
    """A decode run's steps into the simulator's records, as the engine's observers
    take a step's record; ended requests let their closed-loop users send again, as
    after any step."""

    def __init__(
        self,
        driver: _Driver,
        recorder: RequestRecorder,
        step_log: StepLog,
        decisions: list[Decision] | None,
    ) -> None:
        self.clock, self.arrivals = driver.clock, driver.arrivals
        self.recorder, self.step_log, self.decisions = recorder, step_log, decisions

    def step(self, record: StepRecord, num_seqs: int) -> None:
        if record.finished:
            self.ended(record.step, record.finished)
        self.step_log.add_row(record, num_seqs)
        if self.decisions is not None and record.decisions:
            self.decisions.extend(record.decisions)

    def decode_steps(self, steps: DecodeSteps) -> None:
        self.step_log.add_decode_steps(steps)

    def ended(self, step: int, seqs: list[Sequence]) -> None:
        self.recorder.add(seqs)
        now = self.clock.now()
        for seq in seqs:
            self.arrivals.request_ended(seq, now)


def _add_client_latency(rows: list[dict], latency_s: float) -> None:
    """Shift each row's client-side times (TTFT, E2E) by the cost model's client
    latency: the client sees its first and last token this much later than the engine
    emits them (request in, tokens out); the engine's own times are unchanged."""
    if not latency_s:
        return
    for row in rows:
        for name in ("ttft_s", "ttft_from_sent_s", "e2e_s"):
            if row[name] is not None:
                row[name] += latency_s


def _median_itl(rows: list[dict]) -> float | None:
    """The run's median inter-token latency, estimated as the median of per-request
    mean gaps (tpot) weighted by each request's number of gaps. Exact when a
    request's gaps are equal; the simulator does not keep every gap."""
    tpots = [(r["tpot_s"], r["output_tokens"] - 1) for r in rows if r["tpot_s"] is not None]
    if not tpots:
        return None
    values = np.array([t for t, _ in tpots])
    weights = np.array([w for _, w in tpots], dtype=np.float64)
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def run_simulations(
    profile: Profile,
    configs: dict[str, EngineConfig],
    cost_model: CostModel,
    out_dir,
    seed: int | None = None,
    num_requests: int | None = None,
    write_decisions: bool = True,
    trace_file=None,
    machine: dict | None = None,
    speed_band: bool = False,
    extra: dict | None = None,
) -> dict:
    """Simulate each policy's config, write its records, return the combined summary.

    One policy: ``out_dir/requests.parquet``; several: ``out_dir/<policy>/...``.
    ``out_dir/summary.json`` always holds every policy under ``policies``.

    ``trace_file``: every policy's spans go to this OTLP-JSON lines file (resource
    attribute ``schedscope.policy`` tells them apart) and each policy's own into
    its ``spans.parquet``. ``machine``: the fingerprint of the machine simulated
    (:mod:`harness.costmodel.machine`), the summary's ``machine``. ``speed_band``: also simulate
    every policy at the slowest and fastest speed the model's sources ran at, into the
    summary's ``speed_band`` (:mod:`harness.simulate.speed_band`; nothing when the model has no
    observed range). ``extra``: keys added to the combined summary (the rate scale
    ``auto`` chose).
    """
    from harness.records.summary import policy_run_info, policy_summary, run_summary, write_summary

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    used_seed = profile.seed if seed is None else seed
    requests = sample_requests(profile, num_requests, used_seed) if num_requests else None
    combined = run_summary(
        "simulate", profile.name, used_seed, {}, cost_model.to_dict(), machine=machine
    )
    combined.update(extra or {})
    for number, (name, config) in enumerate(configs.items()):
        result = simulate(
            profile,
            config,
            cost_model,
            seed=used_seed,
            requests=requests,
            record_decisions=write_decisions,
            tracing=_policy_tracing(trace_file, config, name),
            truncate_trace_file=number == 0,
        )
        target = out_dir if len(configs) == 1 else out_dir / name
        tracing_info = _write_records(result, target, write_decisions, trace_file, name)
        summary = policy_summary(
            result.requests,
            result.duration_s,
            profile,
            extra=policy_run_info(
                config=dataclasses.asdict(config),
                duration_s=result.duration_s,
                num_steps=result.num_steps,
                step_stats=result.step_stats,
                stall_threshold_s=result.stall_threshold_s,
                kv_cache=result.kv_plan_text,
                tracing=tracing_info,
                faults=result.faults or None,
            ),
        )
        combined["policies"][name] = summary
        if len(configs) > 1:
            write_summary(target / "summary.json", {**combined, "policies": {name: summary}})
    if speed_band:
        from harness.simulate import speed_band as band

        def summaries_at(model: CostModel) -> dict[str, dict]:
            out = {}
            for name, config in configs.items():
                result = simulate(
                    profile,
                    config,
                    model,
                    seed=used_seed,
                    requests=requests,
                    record_decisions=False,
                )
                out[name] = policy_summary(result.requests, result.duration_s, profile)
            return out

        entry = band.band(cost_model, summaries_at)
        if entry is not None:
            combined[band.SUMMARY_KEY] = entry
    write_summary(out_dir / "summary.json", combined)
    return combined


def _policy_tracing(
    trace_file: Path | None, config: EngineConfig, name: str
) -> TracingSettings | None:
    """Tracing settings of one policy of a comparison: spans appended to ``trace_file``
    with resource attribute ``schedscope.policy`` = ``name``; None without a file."""
    if trace_file is None:
        return None
    from engine.telemetry.tracing import TracingSettings

    return TracingSettings(
        trace_file=Path(trace_file),
        model_name=config.model,
        service_name=os.environ.get("OTEL_SERVICE_NAME") or "schedscope-simulate",
        resource_attributes=(("schedscope.policy", name),),
    )


def _write_records(
    result: SimulationResult, target: Path, write_decisions: bool, trace_file, name: str
) -> dict | None:
    """Write one policy's requests, decisions (if asked), steps and, with tracing, its
    spans (``name``'s of the shared ``trace_file``) into ``target``. Returns the
    summary's ``tracing`` entry, or None without tracing."""
    from harness.records.requests import write_parquet

    target.mkdir(parents=True, exist_ok=True)
    write_parquet(result.requests, target / "requests.parquet")
    if write_decisions:
        write_parquet(decisions_frame(result.decisions), target / "decisions.parquet")
    assert result.steps is not None, "simulate() sets the steps"
    write_parquet(result.steps, target / "steps.parquet")
    if result.tracing is None:
        return None
    from harness.records.spans import read_spans, write_spans_parquet

    frame = read_spans(trace_file)
    write_spans_parquet(
        frame.filter(pl.col("resource.schedscope.policy") == name), target / "spans.parquet"
    )
    return {**result.tracing, "trace_file": str(trace_file)}
