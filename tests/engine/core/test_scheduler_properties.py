"""Property tests of the scheduler core, driven through the simulated engine.

Random arrivals, aborts and knobs; after every step the invariants the rest of
schedscope relies on must hold (blocks conserved, both budgets respected, swap
mappings consistent with the decisions, static batches closed to joins), and at
the end every request has ended exactly once with the output it should have.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.core import decisions as d
from engine.core.cost_model import CostModel
from engine.core.sched.policy import LpmPolicy
from engine.core.sched.preemption import policy_order
from engine.core.sequence import SequenceStatus
from engine.llm_engine import LLMEngine
from engine.records.step_record import StepRecord
from tests.support.engine_helpers import STEP_S, Req, Trace, constant_cost, drive, make_engine

#: Deterministic runs (same examples every time); no per-example deadline.
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

FINISHED_OK = {SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH}
ENDED = FINISHED_OK | {SequenceStatus.FINISHED_ABORTED, SequenceStatus.FINISHED_REJECTED}


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass
class Case:
    knobs: dict
    block_size: int
    gpu_blocks: int
    cpu_blocks: int
    watermark: float
    reqs: list[Req]
    aborts: list[tuple[float, str]]


@st.composite
def cases(draw, *, max_requests: int = 14) -> Case:
    """Random knobs, pools, arrivals and aborts."""
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(8, 48))
    chunked = draw(st.booleans())
    if chunked:
        budget = draw(st.one_of(st.none(), st.integers(1, 8).map(lambda k: k * block_size)))
    else:
        budget = draw(st.one_of(st.none(), st.integers(max_model_len, max_model_len + 24)))
    knobs = dict(
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, 8)),
        scheduling_policy=draw(st.sampled_from(["fcfs", "sjf", "priority", "lpm"])),
        preemption_mode=draw(st.sampled_from(["auto", "swap", "recompute"])),
        aging_rate=draw(st.sampled_from([0.0, 0.0, 1.0, 100.0, 10_000.0])),
        max_wait_s=None,  # its own properties below
        batching=draw(st.sampled_from(["continuous", "continuous", "static"])),
        static_batch_timeout_s=draw(st.sampled_from([0.0, 0.001, 0.01])),
        max_waiting=draw(st.sampled_from([None, None, None, None, 2, 6])),
        sjf_size_estimator=draw(st.sampled_from(["request", "oracle"])),
        long_prefill_token_threshold=(
            draw(st.sampled_from([0, 0, 1, 3, max_model_len])) if chunked else 0
        ),
        long_prefill_token_threshold_adaptive=draw(st.booleans()),
    )
    fit = blocks_for(max_model_len, block_size)
    # Pools that hold one to three of the longest requests (memory pressure, decode
    # growth preempting), now and then one too small for the longest.
    if draw(st.integers(0, 9)) == 0:
        gpu_blocks = draw(st.integers(max(1, fit - 2), fit))
    else:
        gpu_blocks = draw(st.integers(fit, 3 * fit))
    cpu_blocks = draw(st.sampled_from([0, 1, 2, fit, 2 * fit, 64]))
    watermark = draw(st.sampled_from([0.0, 0.0, 0.01, 0.2]))
    n = draw(st.integers(1, max_requests))
    spread = draw(st.sampled_from([4, 16, 64]))  # arrival window, in 1/1024 s
    reqs = []
    for i in range(n):
        prompt_len = draw(st.integers(1, max_model_len // 2))
        if draw(st.integers(0, 9)) == 0:  # now and then one too long for max_model_len
            max_tokens = draw(st.integers(1, max_model_len))
        else:
            max_tokens = draw(st.integers(1, max_model_len - prompt_len))
        oracle = draw(st.one_of(st.just(max_tokens), st.integers(1, max_tokens + 3)))
        reqs.append(
            Req(
                id=f"r{i}",
                arrival=draw(st.integers(0, spread)) / 1024,
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                oracle=oracle,
                priority=draw(st.integers(0, 3)),
            )
        )
    aborts = []
    for req in reqs:
        if draw(st.integers(0, 4)) == 0:  # ~1 in 5 requests is aborted at some point
            aborts.append((req.arrival + draw(st.integers(0, 60)) / 1024, req.id))
    return Case(knobs, block_size, gpu_blocks, cpu_blocks, watermark, reqs, aborts)


@st.composite
def recompute_cases(draw) -> Case:
    """Recompute-heavy: no swap space, a tight pool, long outputs (decode growth
    preempts) and chunks of one to three blocks, so re-prefills span steps and a
    request is now and then preempted again while re-prefilling."""
    block_size = draw(st.sampled_from([1, 2]))
    max_model_len = draw(st.integers(16, 40))
    fit = blocks_for(max_model_len, block_size)
    knobs = dict(
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        max_num_batched_tokens=draw(st.integers(1, 3)) * block_size,
        max_num_seqs=draw(st.integers(2, 6)),
        scheduling_policy=draw(st.sampled_from(["fcfs", "sjf", "priority", "lpm"])),
        preemption_mode=draw(st.sampled_from(["recompute", "auto"])),
        aging_rate=0.0,
        batching="continuous",
    )
    gpu_blocks = draw(st.integers(fit, fit + fit // 2))
    reqs = []
    for i in range(draw(st.integers(3, 10))):
        prompt_len = draw(st.integers(1, max_model_len // 3))
        max_tokens = draw(
            st.integers((max_model_len - prompt_len) // 2, max_model_len - prompt_len)
        )
        reqs.append(
            Req(
                f"r{i}",
                draw(st.integers(0, 8)) / 1024,
                prompt_len,
                max_tokens,
                oracle=max_tokens,
                priority=draw(st.integers(0, 3)),
            )
        )
    return Case(knobs, block_size, gpu_blocks, 0, 0.0, reqs, [])


def build(case: Case, cost_model: CostModel | None = None) -> LLMEngine:
    return make_engine(
        block_size=case.block_size,
        gpu_blocks=case.gpu_blocks,
        cpu_blocks=case.cpu_blocks,
        watermark=case.watermark,
        cost_model=cost_model or CostModel(),
        **case.knobs,
    )


class StepChecker:
    """Asserts the per-step properties; remembers what the step started from."""

    def __init__(self, engine: LLMEngine, case: Case) -> None:
        self.engine = engine
        self.case = case
        self.config = engine.config.scheduler
        self.budget = self.config.token_budget
        self.busy_at_start = False
        self.waiting_at_start = 0

    def before(self, trace: Trace) -> None:
        sched = self.engine.scheduler
        self.busy_at_start = bool(sched.running or sched.swapped)
        self.waiting_at_start = sched.num_waiting
        self.pending_at_start = {
            s.request_id: s.num_pending_recompute_tokens for s in sched.running
        }
        # max-wait admissions protected from preemption while this step is built
        self.protected_at_start = {s.request_id for s in sched.running if s.promoted}

    def after(self, outcome: StepRecord, trace: Trace) -> None:
        engine, config = self.engine, self.config
        sched, bm = engine.scheduler, engine.block_manager
        out = outcome
        sched.check_invariants()  # blocks conserved in both pools, queues consistent

        # max_num_seqs
        assert len(out.scheduled) <= config.max_num_seqs
        assert out.num_running <= config.max_num_seqs
        assert len(sched.running) <= config.max_num_seqs

        # token budget, counted two ways: the output's totals and per sequence at execute
        record = engine.executor.records[-1]
        assert record.step == out.step
        assert record.total_scheduled == out.num_batched_tokens, (
            f"output counts {out.num_batched_tokens} tokens, sequences carried "
            f"{record.total_scheduled}"
        )
        assert out.num_batched_tokens <= self.budget
        assert record.total_scheduled <= self.budget
        # vLLM's long-prefill cap: no request computes more in a step than the cap the
        # step was built under (tests/engine/core/test_long_prefill_cap.py: its value)
        cap = sched.admission.prefill_cap
        assert not cap or max(record.scheduled.values(), default=0) <= cap, (cap, record)

        # host pool: never more in use than it has; usage equals what swapped requests hold
        host_used = bm.num_host_blocks - bm.num_free_host_blocks
        assert 0 <= host_used <= bm.num_host_blocks
        assert host_used == sum(len(s.block_table) for s in sched.swapped)
        assert all(bm.is_on_host(s) for s in sched.swapped)
        assert not any(bm.is_on_host(s) for s in sched.running)

        # decisions are well formed and agree with the block mappings
        swap_out_blocks = swap_in_blocks = 0
        preempt_swaps = swap_outs = 0
        for x in out.decisions:
            assert x.kind in d.DECISION_KINDS, x
            if x.kind == d.PREEMPT:
                assert x.mode in ("swap", "recompute"), x
                assert x.beneficiary is not None, x
                check_preemption_mode(x, config.preemption_mode)
                preempt_swaps += x.mode == "swap"
            elif x.kind == d.SWAP_OUT:
                swap_outs += 1
                swap_out_blocks += x.num_blocks
            elif x.kind == d.SWAP_IN:
                swap_in_blocks += x.num_blocks
        assert preempt_swaps == swap_outs
        assert len(out.blocks_to_swap_out) == swap_out_blocks
        assert len(out.blocks_to_swap_in) == swap_in_blocks
        for dev, host in out.blocks_to_swap_out:
            assert 0 <= dev < bm.num_device_blocks and 0 <= host < bm.num_host_blocks
        for host, dev in out.blocks_to_swap_in:
            assert 0 <= dev < bm.num_device_blocks and 0 <= host < bm.num_host_blocks

        for x in out.decisions:
            if (
                x.kind == d.PREEMPT
                and x.mode == "recompute"
                and self.pending_at_start.get(x.request_id)
            ):
                event("recompute-preempted again while re-prefilling")

        check_victim_order(out, sched, self.protected_at_start)
        check_admission_order(out, sched, trace)

        admitted = [x for x in out.decisions if x.kind in (d.ADMIT, d.RECOMPUTE)]
        if config.batching == "static":
            # no joins while a batch runs
            if self.busy_at_start:
                assert not admitted, f"static batch joined mid-batch: {admitted}"
        elif not self.busy_at_start and self.waiting_at_start:
            # continuous batching is work-conserving: an idle engine with waiting
            # requests admits one (every accepted request fits the whole pool)
            assert admitted and out.scheduled, f"idle engine admitted nothing: {out.decisions}"


def check_victim_order(record: StepRecord, sched, protected: set[str]) -> None:
    """Victims are the worst under the policy: no request that kept its place in the
    running set through this step — scheduled or not — is worse than one that was
    preempted. (Decodes are scheduled best first, so anything worse than a victim was
    still unscheduled when the victim was chosen, and should have gone first.)
    Excepted: max-wait admissions that have not produced a token yet (protected) and
    requests that joined the running set in this step. A priority preemption only
    takes requests worse than the one it makes room for."""
    victims = [x for x in record.decisions if x.kind == d.PREEMPT]
    if not victims:
        return
    joined = {x.request_id for x in record.decisions if x.kind in (d.ADMIT, d.RECOMPUTE, d.SWAP_IN)}
    finished_in_step = {e.request_id for e in record.scheduled}
    kept = [
        r
        for r in (*sched.running, *(s for s in record.finished if s.request_id in finished_in_step))
        if r.request_id not in joined and r.request_id not in protected
    ]
    seqs = {
        s.request_id: s
        for s in (*sched.running, *sched.swapped, *sched.requests.values(), *record.finished)
    }
    for x in victims:
        victim = seqs[x.request_id]
        worse = [r.request_id for r in kept if policy_order(r) > policy_order(victim)]
        assert not worse, f"{x.request_id} preempted while worse {worse} kept running: {x}"
        if x.reason == d.REASON_PRIORITY:
            beneficiary = seqs.get(x.beneficiary)
            assert beneficiary is None or policy_order(beneficiary) < policy_order(victim), x


def check_admission_order(record: StepRecord, sched, trace: Trace) -> None:
    """Admissions come max-wait first (oldest first), then in policy order; no request
    left waiting is better than one admitted in policy order. Under lpm, policy order is
    its ranked window (by the cached length each admission records) first, then the
    rest in arrival order (``check_lpm_order``)."""
    admitted = [x for x in record.decisions if x.kind in (d.ADMIT, d.RECOMPUTE)]
    reasons = [x.reason for x in admitted]
    if d.REASON_MAX_WAIT in reasons:
        last_max_wait = len(reasons) - 1 - reasons[::-1].index(d.REASON_MAX_WAIT)
        assert all(r == d.REASON_MAX_WAIT for r in reasons[: last_max_wait + 1]), reasons
    by_id = {s.request_id: s for s in trace.seqs.values()}
    ordered = [x for x in admitted if x.reason in (d.REASON_POLICY_ORDER, d.REASON_STATIC_BATCH)]
    in_order = [by_id[x.request_id] for x in ordered]
    if isinstance(sched.policy, LpmPolicy):
        check_lpm_order(ordered, in_order, sched)
        return
    assert all(x.lpm_cached_tokens is None for x in admitted)
    keys = [policy_order(s) for s in in_order]
    assert keys == sorted(keys), f"admitted out of policy order: {[s.request_id for s in in_order]}"
    if in_order:
        worst_admitted = max(keys)
        waiting = [s for s in sched.requests.values() if s.status is SequenceStatus.WAITING]
        better = [s.request_id for s in waiting if policy_order(s) < worst_admitted]
        assert not better, f"{better} still waiting, better than admitted {in_order[-1].request_id}"


def check_lpm_order(ordered: list[d.Decision], in_order: list, sched) -> None:
    """lpm: the admissions its window ranked (``lpm_cached_tokens`` set; only with prefix
    caching on) come first, by their recorded ranking key, then the rest in arrival
    order; once the pass went past the window, every request still waiting arrived after
    the last it admitted."""
    policy = sched.policy
    caching = sched.block_manager.enable_prefix_caching
    ranked = [x.lpm_cached_tokens is not None for x in ordered]
    assert ranked == sorted(ranked, reverse=True), ranked  # ranked ones first
    if any(x.lpm_cached_tokens for x in ordered):
        event("lpm: a ranked admission found a cached prefix")
    assert caching or not any(ranked)
    keys = [
        (policy.window_key(s, x.lpm_cached_tokens), policy_order(s))
        for x, s in zip(ordered, in_order, strict=True)
        if x.lpm_cached_tokens is not None
    ]
    assert keys == sorted(keys), f"ranked out of order: {[s.request_id for s in in_order]}"
    for x in ordered:
        if x.lpm_cached_tokens is not None:
            assert x.lpm_cached_tokens % sched.block_manager.block_size == 0, x
    rest = [
        policy_order(s)
        for x, s in zip(ordered, in_order, strict=True)
        if x.lpm_cached_tokens is None
    ]
    assert rest == sorted(rest), f"past the window out of arrival order: {rest}"
    if rest:
        waiting = [s for s in sched.requests.values() if s.status is SequenceStatus.WAITING]
        older = [s.request_id for s in waiting if policy_order(s) < rest[-1]]
        assert not older, f"{older} still waiting, older than one admitted past the window"


def check_preemption_mode(x: d.Decision, mode: str) -> None:
    """The mode a preemption took is the one its configured mode and the recorded
    cost predictions call for."""
    assert x.predicted_swap_s is not None and x.predicted_swap_s >= 0, x
    assert x.predicted_recompute_s is not None and x.predicted_recompute_s >= 0, x
    if mode == "recompute":
        assert x.mode == "recompute" and x.detail == "", x
    elif mode == "swap":  # swap only recomputes when the host is full
        expected = d.REASON_SWAP_SPACE_EXHAUSTED if x.mode == "recompute" else ""
        assert x.detail == expected, x
    else:  # auto: the cheaper of the two, swapping only while the host has room
        cheaper_recompute = x.predicted_recompute_s < x.predicted_swap_s
        if cheaper_recompute:
            assert (x.mode, x.detail) == ("recompute", d.REASON_RECOMPUTE_CHEAPER), x
        elif x.mode == "recompute":
            assert x.detail == d.REASON_SWAP_SPACE_EXHAUSTED, x
        else:
            tie = x.predicted_swap_s == x.predicted_recompute_s
            assert x.detail == ("" if tie else d.REASON_SWAP_CHEAPER), x


def run_case(case: Case, cost_model: CostModel | None = None) -> tuple[LLMEngine, Trace]:
    engine = build(case, cost_model)
    checker = StepChecker(engine, case)
    trace = drive(
        engine,
        case.reqs,
        case.aborts,
        max_steps=step_cap(case),
        max_stall_steps=stall_cap(case),
        before_step=checker.before,
        on_step=checker.after,
    )
    note_coverage(case, trace)
    return engine, trace


def step_cap(case: Case) -> int:
    """Far more steps than any correct run needs (each step computes a token or
    moves a request), so a livelock fails quickly instead of hanging."""
    tokens = sum(r.prompt_len + r.max_tokens for r in case.reqs)
    return 200 + 20 * tokens


def stall_cap(case: Case) -> int:
    """More steps without any new token than a correct run takes in a row: a prefill
    chunk (at least one token) of each request's prompt, plus empty steps."""
    return 50 + len(case.reqs) * case.knobs["max_model_len"]


def note_coverage(case: Case, trace: Trace) -> None:
    """Hypothesis statistics (--hypothesis-show-statistics): which paths ran."""
    seen = set()
    for x in trace.decisions:
        label = x.kind
        if x.kind == d.PREEMPT:
            label = f"preempt:{x.reason}:{x.mode}{':' + x.detail if x.detail else ''}"
        elif x.kind in (d.REJECT, d.WAIT, d.ADMIT):
            label = f"{x.kind}:{x.reason}"
        seen.add(label)
    for label in sorted(seen):
        event(label)
    event(f"batching:{case.knobs['batching']}")


def expected_reject_reason(req: Req, case: Case) -> str | None:
    total = req.prompt_len + req.max_tokens
    if total > case.knobs["max_model_len"]:
        return d.REASON_EXCEEDS_MAX_MODEL_LEN
    if blocks_for(total, case.block_size) > case.gpu_blocks:
        return d.REASON_EXCEEDS_KV_POOL
    return None


def check_end_state(engine: LLMEngine, trace: Trace, case: Case) -> None:
    sched, bm = engine.scheduler, engine.block_manager
    assert not sched.requests and not sched.running and not sched.swapped
    assert sched.num_waiting == 0
    assert bm.num_free_device_blocks == bm.num_device_blocks
    assert bm.num_free_host_blocks == bm.num_host_blocks
    sched.check_invariants()

    aborted_ids = {rid for _, rid in case.aborts}
    assert set(trace.seqs) == {r.id for r in case.reqs}  # none lost, none invented
    # every request's end (finished, rejected, aborted) is in exactly one step record
    reported = [s.request_id for o in trace.steps for s in o.finished]
    assert len(reported) == len(set(reported))
    assert set(reported) == set(trace.seqs)
    by_request: dict[str, list[d.Decision]] = {}
    for x in trace.decisions:
        if x.request_id is not None:
            by_request.setdefault(x.request_id, []).append(x)
    for req in case.reqs:
        seq = trace.seqs[req.id]
        kinds = [x.kind for x in by_request.get(req.id, [])]
        assert seq.status in ENDED, seq
        assert seq.is_finished and seq.finished_time is not None
        if seq.status is SequenceStatus.FINISHED_REJECTED:
            expected = expected_reject_reason(req, case)
            assert seq.reject_reason == (expected or d.REASON_QUEUE_FULL), (seq, expected)
            if expected is None:
                assert case.knobs["max_waiting"] is not None
            assert kinds == [d.REJECT], kinds  # rejected at once; never queued or retried
            assert engine.executor.scheduled_per_seq.get(req.id, 0) == 0
            continue
        assert expected_reject_reason(req, case) is None, f"{req} should have been rejected"
        assert kinds.count(d.REJECT) == 0
        assert kinds.count(d.ADMIT) <= 1
        if seq.status is SequenceStatus.FINISHED_ABORTED:
            assert req.id in aborted_ids
            assert kinds.count(d.ABORT) == 1 and kinds[-1] == d.ABORT, kinds
            continue
        assert kinds.count(d.ABORT) == 0
        # it ran to its true end: exactly min(oracle, max_tokens) output tokens
        assert seq.num_output_tokens == req.expected_output, (seq, req)
        assert len(seq.output_token_ids) == req.expected_output
        assert seq.status is (
            SequenceStatus.FINISHED_STOPPED
            if req.oracle <= req.max_tokens
            else SequenceStatus.FINISHED_LENGTH
        )
        assert seq.num_computed_tokens == seq.num_tokens - 1
        acted = [k for k in kinds if k != d.WAIT]  # wait records may precede admission
        assert kinds.count(d.ADMIT) == 1 and acted[0] == d.ADMIT, kinds
        # every preemption was undone before it finished, and counted on the sequence
        swaps = sum(1 for x in by_request[req.id] if x.kind == d.PREEMPT and x.mode == "swap")
        recomputes = sum(
            1 for x in by_request[req.id] if x.kind == d.PREEMPT and x.mode == "recompute"
        )
        assert swaps == seq.num_preemptions_swap == kinds.count(d.SWAP_IN)
        assert recomputes == seq.num_preemptions_recompute == kinds.count(d.RECOMPUTE)
        assert seq.first_scheduled_time is not None
        assert seq.first_scheduled_time >= seq.arrival_time
        assert seq.first_token_time is not None and seq.finished_time >= seq.first_token_time


@pytest.mark.slow
@settings(max_examples=2000, **SETTINGS)
@given(cases())
def test_random_workloads_keep_invariants_and_finish_every_request(case: Case) -> None:
    engine, trace = run_case(case)
    check_end_state(engine, trace, case)


@settings(max_examples=800, **SETTINGS)
@given(recompute_cases())
def test_recompute_cost_is_counted_exactly(case: Case) -> None:
    """Trap 2 accounting: the extra prefill work recompute causes is what
    ``num_recomputed_tokens`` reports.

    A request that finished normally computed each of its ``num_tokens - 1``
    positions once, plus every token that a recompute preemption threw away and
    that had to be prefilled again. So the tokens the executor ran for it equal
    ``num_tokens - 1 + num_recomputed_tokens`` exactly, and the ``num_tokens`` of
    its ``preempt`` (mode recompute) decisions add up to the same figure, less the
    tokens its re-admissions found in the prefix cache (their ``recompute`` decisions'
    ``num_cached_tokens``: a re-hit is not redone).
    """
    engine, trace = run_case(case)
    for req in case.reqs:
        seq = trace.seqs[req.id]
        if seq.status not in FINISHED_OK:
            continue
        ran = engine.executor.scheduled_per_seq[req.id]
        assert ran == seq.num_tokens - 1 + seq.num_recomputed_tokens, (
            f"{req.id}: executor ran {ran} tokens, {seq.num_tokens - 1} positions + "
            f"{seq.num_recomputed_tokens} counted as recomputed"
        )
        thrown_away = sum(
            x.num_tokens for x in trace.of(d.PREEMPT, req.id) if x.mode == "recompute"
        )
        re_hit = sum(x.num_cached_tokens for x in trace.of(d.RECOMPUTE, req.id))
        assert thrown_away == seq.num_recomputed_tokens + re_hit


# -- max_wait_s ------------------------------------------------------------------------


@st.composite
def max_wait_cases(draw, *, arrivals: str = "bursty", swap_only: bool = True) -> Case:
    """Continuous batching, chunked prefill, memory pressure and a max_wait_s bound.

    ``swap_only``: preemption always swaps (the host pool can hold every request at
    once), so a preempted request is SWAPPED, never back in WAITING: waiting
    intervals begin only at arrivals. Otherwise any mode and a small host pool,
    so preemptions may recompute and start new waiting intervals.
    ``arrivals``: "bursty" (many at once) or "spaced" (at least one step apart).
    """
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.integers(8, 32))
    fit = blocks_for(max_model_len, block_size)
    mode = "swap" if swap_only else draw(st.sampled_from(["auto", "swap", "recompute"]))
    knobs = dict(
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        max_num_batched_tokens=draw(st.integers(1, 6)) * block_size,
        max_num_seqs=draw(st.integers(1, 4)),
        scheduling_policy=draw(st.sampled_from(["fcfs", "sjf", "priority", "lpm"])),
        preemption_mode=mode,
        aging_rate=draw(st.sampled_from([0.0, 5.0])),
        max_wait_s=draw(st.integers(1, 12)) * STEP_S,
        batching="continuous",
    )
    gpu_blocks = draw(st.integers(fit, 2 * fit))
    n = draw(st.integers(2, 10))
    cpu_blocks = n * fit if swap_only else draw(st.sampled_from([0, 2, gpu_blocks]))
    if arrivals == "spaced":
        gaps = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
        times = [sum(gaps[: i + 1]) * STEP_S for i in range(n)]
    else:
        times = [draw(st.integers(0, 24)) * STEP_S / 2 for _ in range(n)]
    reqs = []
    budget = knobs["max_num_batched_tokens"]
    for i, arrival in enumerate(times):
        # Swap-only cases: every prompt's prefill fits one step, so a max_wait admission
        # samples its token in the step that admits it (its protection lapses at once).
        longest = min(max_model_len - 1, budget) if swap_only else max_model_len - 1
        prompt_len = draw(st.integers(1, longest))
        max_tokens = draw(st.integers(1, max_model_len - prompt_len))
        reqs.append(
            Req(
                f"r{i}",
                arrival,
                prompt_len,
                max_tokens,
                oracle=draw(st.integers(1, max_tokens)),
                priority=draw(st.integers(0, 3)),
            )
        )
    aborts = []
    if not swap_only:
        for req in reqs:
            if draw(st.integers(0, 5)) == 0:
                aborts.append((req.arrival + draw(st.integers(0, 24)) * STEP_S / 2, req.id))
    return Case(knobs, block_size, gpu_blocks, cpu_blocks, 0.0, reqs, aborts)


def _waiting(engine: LLMEngine):
    return [s for s in engine.scheduler.requests.values() if s.status is SequenceStatus.WAITING]


@settings(max_examples=600, **SETTINGS)
@given(max_wait_cases(arrivals="bursty"))
def test_max_wait_admits_the_oldest_overdue_request_every_step(case: Case) -> None:
    """The progress guarantee ``_promote_overdue``/``_admit_promoted`` give.

    At the start of a step at time ``t``, every WAITING request whose current
    waiting interval began at or before ``t - max_wait_s`` is promoted; promoted
    requests are admitted first, oldest waiting interval first, each preempting
    any running request not yet in the step — except one that was itself admitted
    past its max wait and has not produced a token since (evicting it could
    livelock two overdue requests, see the recompute property below). The oldest
    of them therefore finds the full token budget, a free slot and the whole
    device pool (every accepted request fits it) whenever no such protected
    request is running: it is admitted, with reason ``max_wait``, in that very
    step. Later ones may have to wait for budget, slots or blocks, so overdue
    requests drain at least one per step.

    Checked with swap-only preemption (a victim is SWAPPED, not WAITING, so it
    does not become overdue itself) and prompts whose prefill fits one step (a
    max_wait admission samples its token in its admission step, so no protected
    request is ever running at the start of a step).
    """
    engine = build(case, cost_model=constant_cost())
    max_wait = case.knobs["max_wait_s"]
    expected: dict[str, str | None] = {}

    def before(trace: Trace) -> None:
        now = engine.clock.now()
        overdue = [s for s in _waiting(engine) if s.waiting_since <= now - max_wait]
        oldest = min(overdue, key=lambda s: (s.waiting_since, s.seq_no), default=None)
        expected["oldest"] = oldest.request_id if oldest else None

    def after(outcome: StepRecord, trace: Trace) -> None:
        engine.scheduler.check_invariants()
        oldest = expected["oldest"]
        if oldest is None:
            return
        admitted = [
            x
            for x in outcome.decisions
            if x.kind in (d.ADMIT, d.RECOMPUTE) and x.request_id == oldest
        ]
        assert admitted, f"{oldest} overdue at {outcome.schedule_start} but not admitted"
        assert admitted[0].reason == d.REASON_MAX_WAIT

    trace = drive(
        engine,
        case.reqs,
        max_steps=step_cap(case),
        max_stall_steps=stall_cap(case),
        before_step=before,
        on_step=after,
    )
    note_coverage(case, trace)
    check_end_state(engine, trace, case)


@settings(max_examples=600, **SETTINGS)
@given(max_wait_cases(arrivals="spaced"))
def test_max_wait_bounds_every_waiting_interval(case: Case) -> None:
    """The bound ``max_wait_s`` gives when requests become overdue one at a time.

    Setting: every non-empty step lasts ``STEP_S``; arrivals are at least one
    step apart, every prompt's prefill fits one step, and preemption always swaps
    (the host pool can hold every request at once), so waiting intervals only
    begin at arrivals. Then at most one request
    becomes overdue per step, and by the guarantee above it is admitted in the
    first step that starts after its deadline. That step starts at most one step
    duration after the deadline, so: for every waiting interval (the first one is
    ``first_scheduled_time - arrival_time``), time spent WAITING <= max_wait_s +
    STEP_S. And no request is still WAITING after a step that started past its
    deadline.
    """
    engine = build(case, cost_model=constant_cost())
    max_wait = case.knobs["max_wait_s"]

    def after(outcome: StepRecord, trace: Trace) -> None:
        t = outcome.schedule_start
        for x in outcome.decisions:
            if x.kind in (d.ADMIT, d.RECOMPUTE):
                seq = trace.seqs[x.request_id]
                assert x.time - seq.waiting_since <= max_wait + STEP_S, (
                    f"{seq.request_id} waited {x.time - seq.waiting_since} s > "
                    f"{max_wait} + {STEP_S}"
                )
        late = [s.request_id for s in _waiting(engine) if s.waiting_since <= t - max_wait]
        assert not late, f"still waiting past max_wait_s after the step at {t}: {late}"

    trace = drive(
        engine, case.reqs, max_steps=step_cap(case), max_stall_steps=stall_cap(case), on_step=after
    )
    note_coverage(case, trace)
    check_end_state(engine, trace, case)
    for req in case.reqs:
        queue_s = trace.seqs[req.id].queue_s
        assert queue_s is not None and queue_s <= max_wait + STEP_S


@settings(max_examples=500, **SETTINGS)
@given(max_wait_cases(arrivals="bursty", swap_only=False))
def test_max_wait_with_any_preemption_mode_finishes_every_request(case: Case) -> None:
    """With recompute (chosen, or swap falling back), a victim of a max_wait
    admission goes back to WAITING and its new interval becomes overdue in turn.
    Whatever the engine does about that, it must keep every invariant and still
    finish every request (no livelock of requests preempting each other)."""
    engine, trace = run_case(case, cost_model=constant_cost())
    check_end_state(engine, trace, case)
