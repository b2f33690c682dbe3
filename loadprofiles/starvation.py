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

    fcfs                          21.4 s / 21.2 s   (short: 21.7 / 21.5 s)
    sjf                           67.6 s / 67.4 s   (short:  4.0 /  3.0 s)  <- starved
    sjf --aging-rate 50           19.7 s / 18.6 s   (short:  4.0 /  3.3 s)
    sjf --max-wait-s 10           11.7 s / 11.5 s   (short:  8.6 /  6.6 s)
    sjf --max-wait-s 5             6.7 s /  6.6 s   (short:  4.5 /  4.0 s)
    priority                      13.3 s / 12.5 s   (short:  2.0 /  1.7 s)
    priority --max-wait-s 5        6.4 s /  6.3 s   (short:  4.4 /  4.0 s)

(`--aging-rate` for sjf is tokens per second waited: 50 lets a long request that
waited ~20 s overtake a fresh short one.) Shortened to --duration-scale 0.7 (63 s),
SJF's long max is 42.1 s against 6.7 s with --max-wait-s 5; tests/
test_profile_library.py asserts that direction (> 3x).
"""

from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo
from harness.profiles.locust_hook import expose

PROFILE = Profile(
    name="starvation",
    seed=11,
    description="85% short / 15% long, Poisson at 8 req/s for 90 s (about capacity)",
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
    phases=(Phase(name="sustained", duration_s=90, rate=8.0),),
)

expose(PROFILE, globals())
