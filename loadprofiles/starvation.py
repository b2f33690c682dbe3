"""`starvation` — sustained mixed load under which long requests starve with SJF
(and, more mildly, priority) unless aging or a max-wait bound is on: 85% short
requests, 15% long ones, Poisson at 24 req/s for 90 s.

What it is for: trap 3 in docs/traps.md (long requests starving: in mixed
short + long load without priorities or a time bound, short requests keep cutting
in and long ones wait indefinitely; the fix is queue-weighted scheduling with a
maximum wait). 24 req/s is about this mix's capacity, so the waiting queue never
empties while arrivals last; SJF then always finds a shorter request to admit and
a long request waits until the arrivals stop. Read max and p99 queue wait per class
and the starvation ratio p99(long)/p99(short).

Capacity it assumes: the simulator at the built-in cost model (fitted from served
runs, so it is the served bundled engine on 2 cores), where this mix (mean ~1,150
prompt+output tokens for long, ~170 for short) saturates at about 24 req/s (FCFS: a
queue of ~24 s builds for both classes alike; at 20 req/s it stays under 1 s). It was
8 req/s until the engine's prefill got ~2x faster (2026-12-01). Every class keeps
prompt max + max_tokens <= 2048 (the default --max-model-len).

Measured (`schedscope simulate --profile starvation --policy sjf`, seed 11, built-in
cost model, 2,136 requests; queue wait of the long class, max / p99):

    fcfs                          23.8 s / 23.4 s   (short: 24.1 / 23.7 s)
    sjf                           57.2 s / 55.4 s   (short:  2.5 /  1.0 s)  <- starved
    sjf --aging-rate 100          25.0 s / 23.2 s   (short: 10.0 /  8.2 s)
    sjf --max-wait-s 10           10.4 s / 10.4 s   (short: 10.5 / 10.3 s)
    sjf --max-wait-s 5             5.4 s /  5.4 s   (short:  5.5 /  5.3 s)
    priority                      26.2 s / 25.9 s   (short:  0.8 /  0.6 s)
    priority --max-wait-s 5        5.4 s /  5.3 s   (short:  5.5 /  5.2 s)

(`--aging-rate` for sjf is tokens per second waited: 100 lets a long request that
waited ~8 s overtake a fresh short one. Past capacity, as here, a 5 s bound promotes
nearly every request, so the queue runs close to FCFS order for both classes.)
Shortened to --duration-scale 0.7 (63 s), SJF's long max is 26.8 s against 5.4 s with
--max-wait-s 5 and 11.3 s under FCFS; tests/harness/profiles/test_profile_library.py asserts that
direction (> 3x).
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo

PROFILE = Profile(
    name="starvation",
    seed=11,
    description="85% short / 15% long, Poisson at 24 req/s for 90 s (about capacity)",
    classes=(
        RequestClass(
            name="short",
            weight=0.85,
            priority=0,
            max_tokens=128,
            prompt_tokens=LengthDistribution.lognormal(120, 0.5, max=512),
            output_tokens=LengthDistribution.lognormal(40, 0.5),
            slo=Slo(ttft_s=1.0, tpot_s=0.1),
        ),
        RequestClass(
            name="long",
            weight=0.15,
            priority=1,
            max_tokens=768,
            prompt_tokens=LengthDistribution.lognormal(900, 0.3, max=1280),
            output_tokens=LengthDistribution.lognormal(300, 0.4),
            slo=Slo(ttft_s=10.0, e2e_s=120.0),
        ),
    ),
    phases=(Phase(name="sustained", duration_s=90, rate=24.0),),
)

expose(PROFILE, globals())
