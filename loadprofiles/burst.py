"""`burst` — a base rate with periodic bursts: 6.5 req/s, and every 30 s a 5 s burst at
8x (52 req/s), six times (180 s).

What it is for: how fast each policy absorbs and drains a queue that comes and goes,
and what a burst does to the requests already running (TTFT of newcomers vs TPOT of
the running ones: prefill interference). Bursts push the waiting queue well past
what the token budget admits per step; SJF drains short requests first, so long
requests that arrive in a burst wait for the drain (trap 3 in small, repeated doses).

Capacity it assumes: the mixed classes (80% short chat, 20% long generation) on the
served bundled engine, ~13 req/s on 2 cores (see `mixed`): the base rate is half of
that, a burst is 4x past it (260 requests in 5 s), so each burst leaves a queue for
the base load to drain. (3 and 24 req/s until the engine's prefill got ~2x faster,
2026-12-01.) Every class keeps prompt max + max_tokens <= 2048 (the default
--max-model-len).

Simulator check (`schedscope simulate --profile burst --policy all`, seed 43, built-in
cost model, 2,478 requests; queue-wait p99 short / long, goodput req/s of short /
long): fcfs 9.8 / 9.5 s, 2.07 / 1.60; sjf 6.4 / 13.3 s (long max 14.9 s), 2.71 / 1.23;
priority 4.6 / 10.8 s, 2.64 / 1.04. SJF and priority serve the short class first and
push the wait onto the long one.
"""

from harness.loadgen.expose import expose
from harness.profiles import Phase, Profile
from loadprofiles._chat_mix import chat_classes

BASE_RATE = 6.5
BURST_FACTOR = 8.0
CYCLES = 6

PROFILE = Profile(
    name="burst",
    seed=43,
    description="6.5 req/s base; a 5 s burst at 8x every 30 s, six times (mixed classes)",
    classes=chat_classes(),
    phases=tuple(
        phase
        for k in range(CYCLES)
        for phase in (
            Phase(name=f"base{k}", duration_s=25, rate=BASE_RATE),
            Phase(name=f"burst{k}", duration_s=5, rate=BASE_RATE * BURST_FACTOR),
        )
    ),
)

expose(PROFILE, globals())
