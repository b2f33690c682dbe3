"""`starvation` — sustained mixed load under which long requests starve with SJF
(and, more mildly, priority) unless aging or a max-wait bound is on: 85% short
requests, 15% long ones, Poisson at 8 req/s for 90 s.

What it is for: trap 3 of the scheduler guide ("忽视长尾请求的饿死问题": in mixed
short + long load without priorities or a time bound, short requests keep cutting
in and long ones wait indefinitely; the fix is queue-weighted scheduling with a
maximum wait). 8 req/s is about this mix's capacity, so the waiting queue never
empties while arrivals last; SJF then always finds a shorter request to admit and
a long request waits until the arrivals stop. Read max and p99 queue wait per class
and the starvation ratio p99(long)/p99(short).

Capacity it assumes: the simulator at the built-in cost model, where this mix (mean
~1,150 prompt+output tokens for long, ~170 for short) saturates at about 8 req/s
(FCFS: a queue of ~21 s builds for both classes alike). The served bundled engine on
2 cores sustains ~6 req/s of the lighter mixed profile: run it there with
--rate-scale 0.75. Every class keeps prompt max + max_tokens <= 2048 (the default
--max-model-len).

Measured (`schedscope simulate --profile starvation --policy sjf`, seed 11, built-in
cost model, 726 requests; queue wait of the long class, max / p99):

    fcfs                          23.0 s / 22.8 s   (short: 23.5 / 23.0 s)
    sjf                           65.7 s / 63.7 s   (short:  3.8 /  2.5 s)  <- starved
    sjf --aging-rate 50           18.0 s / 14.1 s   (short:  4.3 /  3.2 s)
    sjf --max-wait-s 10           12.7 s / 11.3 s   (short: 11.0 / 10.6 s)
    sjf --max-wait-s 5            12.6 s / 12.5 s   (short: 13.1 / 12.7 s)
    priority                      20.1 s / 20.0 s   (short:  2.3 /  2.1 s)
    priority --max-wait-s 5        7.0 s /  6.9 s   (short:  6.6 /  6.2 s)

(`--aging-rate` for sjf is tokens per second waited: 50 lets a long request that
waited ~20 s overtake a fresh short one. Past capacity, as here, a 5 s bound promotes
nearly every request, so the queue runs close to FCFS order for both classes.) Shortened to --duration-scale 0.7 (63 s),
SJF's long max is 47.7 s against 12.6 s with --max-wait-s 5; tests/
test_profile_library.py asserts that direction (> 3x).
"""

from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo
from harness.profiles.locust_hook import expose

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
