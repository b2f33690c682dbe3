"""The lpm policy (longest prefix match): the waiting request with the longest cached
prefix first, ties by arrival; aging and the max-wait bound for cold requests; a window
of the oldest waiting requests ranked per admission pass, the rest FCFS; FCFS exactly
with prefix caching off.

Engines run on the constant cost model of ``engine_helpers`` (every non-empty step
lasts ``STEP_S``), 4-token blocks. ``P`` is a 32-token prefix (8 blocks): a request
whose prompt begins with it, once a request that began with it has run, has 32 tokens
cached ("hot"); a prompt of its own has none ("cold").
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import SchedulerConfig
from engine.core import decisions as d
from engine.core.block_manager import BlockManager
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sched.policy import LpmPolicy, make_policy
from engine.core.sched.prefix_order import PrefixRanking
from engine.core.sched.waiting_queue import WaitingQueue
from engine.core.sequence import Sequence, SequenceStatus
from engine.llm_engine import LLMEngine
from tests.support.engine_helpers import STEP_S, Req, Trace, add, drive, make_engine

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

P = tuple(range(500, 532))  # 8 blocks of 4 tokens
HOT = 32  # the tokens a hot request finds cached


def hot(rid: str, arrival: float, max_tokens: int = 2, suffix: int = 1) -> Req:
    return Req(
        rid,
        arrival,
        prompt=(*P, *range(9000 + 10 * suffix, 9002 + 10 * suffix)),
        max_tokens=max_tokens,
    )


def cold(rid: str, arrival: float, max_tokens: int = 2) -> Req:
    return Req(rid, arrival, prompt_len=34, max_tokens=max_tokens)


def warmed(max_num_seqs: int = 1, policy: str = "lpm", **knobs) -> tuple[LLMEngine, Trace]:
    """An engine whose prefix cache holds ``P`` (a request that began with it ran to its
    end at t=0), its clock at 1.0."""
    engine = make_engine(
        max_num_seqs=max_num_seqs, scheduling_policy=policy, gpu_blocks=256, **knobs
    )
    trace = drive(engine, [Req("warm", 0.0, prompt=(*P, 1), max_tokens=1)])
    engine.clock.advance_to(1.0)
    return engine, trace


def queue_then_run(engine: LLMEngine, trace: Trace, reqs: list[Req], **kw) -> Trace:
    """Add ``reqs`` (arrival times in the past) at once, then run everything to its end:
    the first step that admits sees all of them waiting."""
    for req in reqs:
        trace.seqs[req.id] = add(engine, req)
    return drive(engine, [], trace=trace, **kw)


def admitted(trace: Trace) -> list[str]:
    return [r for r in trace.admission_order() if r != "warm"]


def lpm_cached(trace: Trace) -> dict[str, int | None]:
    return {x.request_id: x.lpm_cached_tokens for x in trace.of(d.ADMIT)}


# -- the order -----------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "expected"), [("lpm", ["b", "a"]), ("fcfs", ["a", "b"])])
def test_a_request_with_a_cached_prefix_is_admitted_before_an_earlier_cold_one(policy, expected):
    engine, trace = warmed(policy=policy)
    trace = queue_then_run(engine, trace, [cold("a", 0.5), hot("b", 0.6)])
    assert admitted(trace) == expected
    b = next(x for x in trace.of(d.ADMIT) if x.request_id == "b")
    assert b.num_cached_tokens == HOT
    if policy == "lpm":
        # the decision carries the cached length that ranked it, as its span does
        assert lpm_cached(trace) == {"warm": 0, "a": 0, "b": HOT}
        assert b.reason == d.REASON_POLICY_ORDER
    else:
        assert set(lpm_cached(trace).values()) == {None}


def test_longer_cached_prefix_first_and_ties_by_arrival():
    engine, trace = warmed()
    half = Req("half", 0.1, prompt=(*P[:16], *range(7000, 7020)), max_tokens=2)  # 16 cached
    reqs = [
        cold("c1", 0.1),
        half,
        hot("h1", 0.3, suffix=1),
        cold("c2", 0.05),
        hot("h2", 0.2, suffix=2),
    ]
    trace = queue_then_run(engine, trace, reqs)
    # h2 (0.2) before h1 (0.3): tied at 32 cached tokens, the earlier arrival first;
    # the cold pair in arrival order after them.
    assert admitted(trace) == ["h2", "h1", "half", "c2", "c1"]
    assert lpm_cached(trace) == {"warm": 0, "h2": HOT, "h1": HOT, "half": 16, "c2": 0, "c1": 0}


def test_the_static_key_is_the_arrival_so_victims_are_the_latest_arrivals_as_under_fcfs():
    engine = make_engine(scheduling_policy="lpm")
    policy = engine.scheduler.policy
    early = Sequence(EngineRequest("e", [1, 2], SamplingParams(), 1.0), 0)
    late = Sequence(EngineRequest("l", [1, 2], SamplingParams(), 2.0), 1)
    assert isinstance(policy, LpmPolicy) and not policy.preempts_for_waiting
    assert policy.key(early) == 1.0 and policy.key(late) == 2.0  # the running set's order


# -- aging and max-wait ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aging_rate", "gap", "first"),
    [
        (0.0, 10.0, "hot"),  # no aging: however long the cold one waited, hot first
        (100.0, 0.25, "hot"),  # 25 tokens of aging < 32 cached
        (100.0, 0.5, "cold"),  # 50 tokens of aging > 32 cached: the cold one overtakes
        (1000.0, 0.05, "cold"),
    ],
)
def test_aging_lets_a_cold_request_that_waited_long_enough_overtake(aging_rate, gap, first):
    """Cold arrived ``gap`` seconds before hot; its key gains ``aging_rate`` tokens per
    second waited, so it goes first once ``aging_rate * gap`` exceeds the 32 tokens hot
    finds cached."""
    engine, trace = warmed(aging_rate=aging_rate)
    engine.clock.advance_to(20.0)
    trace = queue_then_run(engine, trace, [cold("cold", 19.0 - gap), hot("hot", 19.0)])
    assert admitted(trace)[0] == first


def hot_stream(n: int, start: float, every: float) -> list[Req]:
    return [hot(f"h{i:02d}", start + i * every, max_tokens=2, suffix=i) for i in range(n)]


def test_without_a_bound_a_cold_request_waits_behind_every_hot_one():
    engine, trace = warmed()
    reqs = [cold("cold", 1.0), *hot_stream(30, 1.0, STEP_S)]
    trace = drive(engine, reqs, trace=trace)
    assert admitted(trace)[-1] == "cold"


def test_max_wait_promotes_a_starving_cold_request():
    max_wait = 8 * STEP_S
    engine, trace = warmed(max_wait_s=max_wait)
    reqs = [cold("cold", 1.0), *hot_stream(30, 1.0, STEP_S)]
    trace = drive(engine, reqs, trace=trace)
    x = next(x for x in trace.of(d.ADMIT) if x.request_id == "cold")
    assert x.reason == d.REASON_MAX_WAIT and x.lpm_cached_tokens is None
    assert x.time - 1.0 <= max_wait + STEP_S
    order = admitted(trace)
    assert 0 < order.index("cold") < len(order) - 1  # some hot first, some after it


# -- the window ------------------------------------------------------------------------


def test_beyond_the_window_the_queue_is_fcfs(monkeypatch):
    """A window of 2: the two oldest are ranked (hot b before cold a), the hot c beyond
    it waits in arrival order, unranked; with the window over all three c is ranked
    second."""
    monkeypatch.setattr(LpmPolicy, "WINDOW", 2)
    engine, trace = warmed(max_num_seqs=8)
    assert engine.scheduler.policy.window == 2
    reqs = [cold("a", 0.1), hot("b", 0.2, suffix=1), hot("c", 0.3, suffix=2)]
    trace = queue_then_run(engine, trace, reqs)
    assert admitted(trace) == ["b", "a", "c"]
    assert lpm_cached(trace) == {"warm": 0, "b": HOT, "a": 0, "c": None}
    c = next(x for x in trace.of(d.ADMIT) if x.request_id == "c")
    assert c.num_cached_tokens == HOT  # not ranked by it, but its hits taken all the same

    monkeypatch.setattr(LpmPolicy, "WINDOW", 3)
    engine, trace = warmed(max_num_seqs=8)
    trace = queue_then_run(engine, trace, reqs)
    assert admitted(trace) == ["b", "c", "a"]


def test_a_queue_longer_than_the_window_admits_everything(monkeypatch):
    """40 requests, a window of 4, one seat: all finish; every admission is either
    ranked (a window's best) or, once the queue is down to nothing ranked, in arrival
    order."""
    monkeypatch.setattr(LpmPolicy, "WINDOW", 4)
    engine, trace = warmed(max_num_seqs=1)
    reqs = [
        (hot(f"r{i:02d}", 0.1 + i / 100, suffix=i) if i % 3 else cold(f"r{i:02d}", 0.1 + i / 100))
        for i in range(40)
    ]
    trace = queue_then_run(engine, trace, reqs)
    assert sorted(admitted(trace)) == [r.id for r in reqs]
    assert all(trace.seqs[r.id].status is SequenceStatus.FINISHED_LENGTH for r in reqs)
    # one seat, so one admission per pass and every pass ranks: each admission is the
    # best of the 4 oldest waiting when it was made
    waiting = [r.id for r in reqs]
    for rid in admitted(trace):
        window = waiting[:4]
        hot_ones = [w for w in window if int(w[1:]) % 3]
        assert rid == (hot_ones[0] if hot_ones else window[0]), (rid, window)
        waiting.remove(rid)


# -- with prefix caching off lpm is fcfs --------------------------------------------------


@st.composite
def workloads(draw):
    """Random arrivals, prompts that share prefixes (with caching on, lpm would reorder
    them), memory pressure, any preemption mode, sometimes aging and a max-wait bound."""
    prefixes = [tuple(range(1000 * k, 1000 * k + 12)) for k in range(1, 4)]
    reqs = []
    for i in range(draw(st.integers(2, 14))):
        suffix = tuple(range(50_000 + 100 * i, 50_000 + 100 * i + draw(st.integers(1, 8))))
        share = draw(st.integers(-1, 2))
        prompt = (*prefixes[share], *suffix) if share >= 0 else (90_000 + i, *suffix)
        reqs.append(
            Req(
                f"r{i:02d}",
                draw(st.integers(0, 40)) / 256,
                prompt=prompt,
                max_tokens=draw(st.integers(1, 12)),
            )
        )
    knobs = dict(
        max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.sampled_from([None, 8, 16])),
        preemption_mode=draw(st.sampled_from(["auto", "swap", "recompute"])),
        aging_rate=draw(st.sampled_from([0.0, 100.0])),
        max_wait_s=draw(st.sampled_from([None, 4 * STEP_S])),
        batching=draw(st.sampled_from(["continuous", "continuous", "static"])),
        enable_chunked_prefill=draw(st.booleans()),
    )
    if not knobs["enable_chunked_prefill"]:
        knobs["max_num_batched_tokens"] = None
    gpu_blocks = draw(st.integers(8, 24))
    return reqs, knobs, gpu_blocks


def decision_log(policy: str, reqs, knobs, gpu_blocks, caching: bool) -> list[tuple]:
    engine = make_engine(
        scheduling_policy=policy,
        gpu_blocks=gpu_blocks,
        cpu_blocks=16,
        max_model_len=64,
        enable_prefix_caching=caching,
        **knobs,
    )
    trace = drive(engine, reqs)
    return [
        (x.kind, x.step, x.time, x.request_id, x.reason, x.mode, x.num_cached_tokens)
        for x in trace.decisions
    ]


@settings(max_examples=150, **SETTINGS)
@given(workloads())
def test_with_prefix_caching_off_lpm_decides_exactly_as_fcfs(case):
    reqs, knobs, gpu_blocks = case
    fcfs = decision_log("fcfs", reqs, knobs, gpu_blocks, caching=False)
    lpm = decision_log("lpm", reqs, knobs, gpu_blocks, caching=False)
    assert lpm == fcfs


# -- the ranking itself --------------------------------------------------------------------


def _seq(i: int, arrival: float, prompt: list[int]) -> Sequence:
    return Sequence(EngineRequest(f"s{i}", prompt, SamplingParams(), arrival), i)


def _prefill(bm: BlockManager, prompt: list[int], keep: bool = True) -> None:
    """A request of ``prompt`` admitted with its hits, prefilled and ended: its full
    blocks stay cached (``keep``), or are dropped."""
    s = _seq(-1, 0.0, prompt)
    bm.allocate(s, bm.lookup(s))
    bm.register(s, s.num_tokens if keep else 0)
    bm.free(s, keep_cached=keep)


def _reference(live, window, rate, bm):
    """The ``window`` oldest of ``live`` by ``rate * arrival - cached`` then arrival,
    each with its cached tokens by a whole lookup."""
    oldest = sorted(live, key=lambda s: (s.arrival_time, s.seq_no))[:window]
    cached = {s.seq_no: len(bm.lookup(s)) * 4 for s in oldest}
    ranked = sorted(
        oldest,
        key=lambda s: (rate * s.arrival_time - cached[s.seq_no], s.arrival_time, s.seq_no),
    )
    return [(s.seq_no, cached[s.seq_no]) for s in ranked]


@settings(max_examples=200, **SETTINGS)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(-1, 2), st.integers(1, 9)),
        min_size=1,
        max_size=20,
    ),
    st.sets(st.integers(0, 19)),
    st.integers(1, 8),
    st.sampled_from([0.0, 1.0, 8.0]),
    st.lists(st.integers(0, 2), max_size=2),
    st.integers(0, 6),
    st.sets(st.integers(0, 19)),
)
def test_the_window_is_the_oldest_waiting_ranked_by_aged_cached_length(
    raw, removed, window, rate, extend, evict, removed_later
):
    """Against a plain reference: of the waiting requests still queued (some removed,
    leaving stale heap entries), the ``window`` oldest, sorted by ``rate * arrival -
    cached tokens`` then arrival order, cached tokens as a whole ``lookup`` finds them.
    The queue is left as it was (its next request the same). Ranked again by the same
    ranking (its lookups resumed from the first ranking's hits) after the cache changed
    (prefixes extended, cached blocks evicted) and more requests left: the reference
    again."""
    bm = BlockManager(4, 64, 0, watermark=0.0, enable_prefix_caching=True)
    prefixes = [list(range(100 * k, 100 * k + 4 * (k + 1))) for k in range(3)]  # 1..3 blocks
    for p in prefixes:  # cache each prefix: prefilled by a request that has ended
        _prefill(bm, [*p, 1])
    waiting = WaitingQueue()
    policy = LpmPolicy(rate, window)
    ranking = PrefixRanking(policy, waiting, bm)
    seqs = []
    for i, (arrival, share, extra) in enumerate(raw):
        prompt = [*prefixes[share], *range(9000, 9000 + extra)] if share >= 0 else [7000 + i] * 5
        s = _seq(i, arrival / 4, prompt)
        s.policy_key = policy.key(s)
        waiting.push(s, s.arrival_time)
        seqs.append(s)

    def leave(indices):
        for i in sorted(indices):
            if i < len(seqs) and seqs[i].status is SequenceStatus.WAITING:
                waiting.remove(seqs[i], 10.0)
                seqs[i].status = SequenceStatus.RUNNING

    leave(removed)
    live = [s for s in seqs if s.status is SequenceStatus.WAITING]
    head = waiting.peek()
    got = ranking.ranked_window()
    assert [(s.seq_no, c) for s, c in got] == _reference(live, window, rate, bm)
    assert waiting.peek() is head and len(waiting) == len(live)
    assert waiting.first(len(seqs) + 1) == sorted(live, key=lambda s: (s.arrival_time, s.seq_no))

    for k in extend:  # a longer prompt behind prefix k: two more blocks cached after it
        _prefill(bm, [*prefixes[k], *range(9000, 9008), 1])
    if evict:  # a cold request takes every truly free block and ``evict`` cached ones
        free, evictable = bm.free_pools
        _prefill(bm, [5000] * (4 * (len(free) + min(evict, len(evictable)))), keep=False)
    leave(removed_later)
    live = [s for s in seqs if s.status is SequenceStatus.WAITING]
    got = ranking.ranked_window()
    assert [(s.seq_no, c) for s, c in got] == _reference(live, window, rate, bm)


@settings(max_examples=200, **SETTINGS)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 64)), min_size=1, max_size=12),
    st.integers(0, 40).map(lambda r: r / 4),
    st.integers(0, 80),
)
def test_the_window_key_orders_as_the_aged_key(raw, rate, later_eighths):
    """Ordering by ``rate * arrival - cached`` equals ordering by the aged key at any
    later ``now``: ``-cached - rate * (now - arrival)`` (exact in floating point here)."""
    seqs = [_seq(i, t / 8, [1, 2]) for i, (t, _) in enumerate(sorted(raw))]
    cached = [c for _, c in sorted(raw)]
    policy = make_policy(SchedulerConfig(scheduling_policy="lpm", aging_rate=rate))
    assert isinstance(policy, LpmPolicy) and policy.window == LpmPolicy.WINDOW == 128
    now = max(s.arrival_time for s in seqs) + later_eighths / 8
    by_window = sorted(seqs, key=lambda s: (policy.window_key(s, cached[s.seq_no]), s.seq_no))
    by_aged = sorted(
        seqs,
        key=lambda s: (-cached[s.seq_no] - rate * (now - s.arrival_time), s.seq_no),
    )
    assert [s.seq_no for s in by_window] == [s.seq_no for s in by_aged]
