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
(``harness.records.RequestRecorder``), per-step composition (``harness.steps.StepLog``)
and decisions.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field
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
from harness.decision_log import decisions_frame
from harness.profiles import Profile, RequestSpec, build_plan, sample_requests
from harness.records import RequestRecorder, add_stalls, requests_frame, stall_threshold
from harness.steps import StepLog

if TYPE_CHECKING:
    from engine.telemetry.tracing import TracingSettings

#: The token every simulated prompt is made of; its value changes nothing.
PROMPT_TOKEN_ID = 5
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


def _pending_arrivals(profile: Profile, seed: int | None, requests: list[RequestSpec] | None):
    """Open-loop specs in time order plus the closed phases of the plan."""
    if requests is not None:
        return requests, []
    plan = build_plan(profile, seed)
    closed = [p for p in plan.phases if p.kind == "closed"]
    return plan.open_loop_requests(), closed


def simulate(
    profile: Profile,
    config: EngineConfig,
    cost_model: CostModel | None = None,
    seed: int | None = None,
    requests: list[RequestSpec] | None = None,
    record_decisions: bool = True,
    tracing: TracingSettings | None = None,
    truncate_trace_file: bool = True,
) -> SimulationResult:
    """Run ``profile`` (or an explicit list of open-loop ``requests``) through a
    simulated engine and return one record per request.

    With ``tracing``, the run's spans (virtual time: Unix time = engine time, the
    simulator's epoch is 0) go where it says; ``truncate_trace_file=False`` appends
    to its file (the next policy of a comparison).
    """
    engine = build_simulated_engine(config, cost_model or CostModel())
    clock = engine.clock
    policy = config.scheduler.scheduling_policy
    open_specs, closed_phases = _pending_arrivals(profile, seed, requests)
    recorder = engine.observers.add(RequestRecorder(policy, profile.name))
    step_log = engine.observers.add(StepLog())
    decisions: list[Decision] = []
    if record_decisions:
        engine.observers.add(lambda record: decisions.extend(record.decisions))
    traced = None
    if tracing is not None:
        from engine.telemetry.tracing import install_tracing

        traced = install_tracing(engine, tracing, truncate_file=truncate_trace_file)

    # Closed-loop arrivals: (time, order, phase plan) heap of "a user sends now".
    user_heap: list[tuple[float, int, int]] = []
    closed_by_index = {}
    order = 0
    for phase_no, phase_plan in enumerate(closed_phases):
        closed_by_index[phase_no] = phase_plan
        for _ in range(phase_plan.concurrency):
            heapq.heappush(user_heap, (phase_plan.start_s, order, phase_no))
            order += 1
    user_of: dict[str, int] = {}  # request id -> closed phase number of its user

    empty_in_a_row = 0
    idle = 0.0  # virtual seconds with nothing to do since the last step
    next_open = 0
    num_open = len(open_specs)

    def add(spec: RequestSpec, at: float) -> None:
        engine.add_request(
            EngineRequest(
                spec.request_id,
                [PROMPT_TOKEN_ID] * spec.prompt_tokens,
                SamplingParams(max_tokens=spec.max_tokens),
                arrival_time=at,
                priority=spec.priority,
                request_class=spec.class_name,
                oracle_output_tokens=spec.output_tokens,
            )
        )

    def user_done(seq: Sequence) -> None:
        """A closed-loop user's request ended: it sends its next one."""
        phase_no = user_of.pop(seq.request_id, None)
        if phase_no is None:
            return
        end = closed_by_index[phase_no].end_s
        t = seq.finished_time if seq.finished_time is not None else clock.now()
        if seq.status is SequenceStatus.FINISHED_REJECTED:
            # Re-sending at the same instant would spin without the clock moving.
            t += REJECTED_RETRY_AFTER_S
        if t < end:
            nonlocal order
            heapq.heappush(user_heap, (t, order, phase_no))
            order += 1

    def next_arrival_time() -> float | None:
        t_open = open_specs[next_open].scheduled_at if next_open < num_open else None
        t_user = user_heap[0][0] if user_heap else None
        if t_open is None:
            return t_user
        if t_user is None:
            return t_open
        return min(t_open, t_user)

    while True:
        now = clock.now()
        # Admit everything that has arrived by now, in arrival order.
        while True:
            t_open = open_specs[next_open].scheduled_at if next_open < num_open else None
            t_user = user_heap[0][0] if user_heap else None
            if t_open is not None and t_open <= now and (t_user is None or t_open <= t_user):
                add(open_specs[next_open], t_open)
                next_open += 1
            elif t_user is not None and t_user <= now:
                t, _, phase_no = heapq.heappop(user_heap)
                spec = closed_by_index[phase_no].next_request()
                user_of[spec.request_id] = phase_no
                add(spec, t)
            else:
                break
        if engine.has_work():
            record: StepRecord = engine.step(idle_before_s=idle)
            idle = 0.0
            for seq in record.finished:
                user_done(seq)
            if record.is_empty and engine.has_unfinished():
                empty_in_a_row += 1
                if empty_in_a_row > MAX_EMPTY_STEPS_IN_A_ROW:
                    raise SimulationError(
                        f"engine made no progress for {empty_in_a_row} steps at t={now}"
                    )
                targets = [t for t in (record.wake_at, next_arrival_time()) if t is not None]
                if not targets:
                    raise SimulationError(f"engine idle with unfinished requests at t={now}")
                before = clock.now()
                clock.advance_to(min(targets))
                idle += clock.now() - before
            elif not record.is_empty:
                empty_in_a_row = 0
            continue
        t_next = next_arrival_time()
        if t_next is None:
            break
        before = clock.now()
        clock.advance_to(t_next)
        idle += clock.now() - before

    tracing_stats = traced.shutdown() if traced is not None else None
    rows = recorder.rows
    latency = (cost_model or CostModel()).client_latency_s
    if latency:
        # The client sees its first and last token this much later than the engine
        # emits them (request in, tokens out); the engine's own times are unchanged.
        for row in rows:
            for name in ("ttft_s", "ttft_from_sent_s", "e2e_s"):
                if row[name] is not None:
                    row[name] += latency
    threshold = stall_threshold(_median_itl(rows))
    add_stalls(rows, threshold)
    frame = requests_frame(rows).sort("scheduled_at", "request_id")
    return SimulationResult(
        policy=policy,
        profile=profile.name,
        requests=frame,
        decisions=decisions,
        duration_s=clock.now(),
        num_steps=step_log.num_steps,
        stall_threshold_s=threshold,
        kv_plan_text=engine.kv_plan.describe(config.cache.block_size),
        step_stats=step_log.summary(),
        steps=step_log.frame(),
        tracing=tracing_stats,
    )


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
) -> dict:
    """Simulate each policy's config, write its records, return the combined summary.

    One policy: ``out_dir/requests.parquet``; several: ``out_dir/<policy>/...``.
    ``out_dir/summary.json`` always holds every policy under ``policies``.

    ``trace_file``: every policy's spans go to this OTLP-JSON lines file (resource
    attribute ``schedscope.policy`` tells them apart) and each policy's own into
    its ``spans.parquet``.
    """
    import dataclasses
    from pathlib import Path

    from harness.records import write_parquet
    from harness.summary import SUMMARY_SCHEMA_VERSION, policy_summary, write_summary

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    used_seed = profile.seed if seed is None else seed
    requests = sample_requests(profile, num_requests, used_seed) if num_requests else None
    combined = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "mode": "simulate",
        "profile": profile.name,
        "seed": used_seed,
        "cost_model": cost_model.to_dict(),
        "policies": {},
    }
    for number, (name, config) in enumerate(configs.items()):
        tracing = None
        if trace_file is not None:
            from engine.telemetry.tracing import TracingSettings

            tracing = TracingSettings(
                trace_file=Path(trace_file),
                model_name=config.model,
                service_name=os.environ.get("OTEL_SERVICE_NAME") or "schedscope-simulate",
                resource_attributes=(("schedscope.policy", name),),
            )
        result = simulate(
            profile,
            config,
            cost_model,
            seed=used_seed,
            requests=requests,
            record_decisions=write_decisions,
            tracing=tracing,
            truncate_trace_file=number == 0,
        )
        target = out_dir if len(configs) == 1 else out_dir / name
        target.mkdir(parents=True, exist_ok=True)
        write_parquet(result.requests, target / "requests.parquet")
        if write_decisions:
            write_parquet(decisions_frame(result.decisions), target / "decisions.parquet")
        write_parquet(result.steps, target / "steps.parquet")
        extra_tracing = {}
        if result.tracing is not None:
            from harness.spans import read_spans, write_spans_parquet

            frame = read_spans(trace_file)
            write_spans_parquet(
                frame.filter(pl.col("resource.schedscope.policy") == name), target / "spans.parquet"
            )
            extra_tracing = {"tracing": {**result.tracing, "trace_file": str(trace_file)}}
        summary = policy_summary(
            result.requests,
            result.duration_s,
            profile,
            extra={
                "config": dataclasses.asdict(config),
                "duration_s": result.duration_s,
                "num_steps": result.num_steps,
                "step_stats": result.step_stats,
                "stall_threshold_s": result.stall_threshold_s,
                "kv_cache": result.kv_plan_text,
                **extra_tracing,
            },
        )
        combined["policies"][name] = summary
        if len(configs) > 1:
            write_summary(target / "summary.json", {**combined, "policies": {name: summary}})
    write_summary(out_dir / "summary.json", combined)
    return combined
