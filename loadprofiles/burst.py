"""`burst` — a base rate with periodic bursts: 3 req/s, and every 30 s a 5 s burst at
8x (24 req/s), six times (180 s).

What it is for: how fast each policy absorbs and drains a queue that comes and goes,
and what a burst does to the requests already running (TTFT of newcomers vs TPOT of
the running ones: prefill interference). Bursts push the waiting queue well past
what the token budget admits per step; SJF drains short requests first, so long
requests that arrive in a burst wait for the drain (trap 3 in small, repeated doses).

Capacity it assumes: the mixed classes (80% short chat, 20% long generation) on the
served bundled engine, ~6 req/s on 2 cores (see `mixed`): the base rate is half of
that, a burst is 4x past it (120 requests in 5 s), so each burst leaves a queue for
the base load to drain. Every class keeps prompt max + max_tokens
<= 2048 (the default --max-model-len).

Simulator check (`schedscope simulate --profile burst --policy all`, seed 43, built-in
cost model, 1,176 requests; queue-wait p99 short / long, goodput req/s):
fcfs 5.9 / 5.7 s, 2.99; sjf 2.3 / 6.0 s (long max 6.7 s), 4.39; priority 2.7 / 6.7 s,
3.03. Every burst drains before the next one; SJF wins on goodput by serving the
short class first.
"""

from harness.profiles import Phase, Profile
from harness.profiles.locust_hook import expose
from loadprofiles._chat_mix import chat_classes

BASE_RATE = 3.0
BURST_FACTOR = 8.0
CYCLES = 6

PROFILE = Profile(
    name="burst",
    seed=43,
    description="3 req/s base; a 5 s burst at 8x every 30 s, six times (mixed classes)",
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
