"""`ramp` — the arrival rate rises linearly from 0.5 to 8 req/s over 60 s, then holds
8 req/s for 15 s (mixed classes, Poisson: a `rate_end` phase).

What it is for: finding the knee — the rate at which queue wait and TTFT leave the
floor — in one run, and seeing which policy holds the short class's TTFT longest as
load passes capacity. Read latency against `scheduled_at` (the intended rate at t is
0.5 + 7.5 t / 60).

Capacity it assumes: the served bundled engine sustains ~6 req/s of the mixed classes
on 2 cores (see `mixed`), crossed at t ~ 44 s; the last 15 s at 8 req/s are a third
past it, so a queue builds at the end. Every class keeps prompt max + max_tokens <=
2048 (the default --max-model-len).

Simulator check (`schedscope simulate --profile ramp --policy all`, seed 44, built-in
cost model, 384 requests): queue-wait p99 short / long fcfs 1.0 / 1.0 s, sjf 0.8 /
1.4 s, priority 1.1 / 1.6 s — the built-in cost model puts this mix's knee above
8 req/s (the served engine's is ~6). With --rate-scale 1.5 (0.75 -> 12 req/s) the
knee shows: fcfs 9.1 / 8.6 s, sjf 1.7 / 15.7 s, priority 1.2 / 13.3 s.
"""

from harness.profiles import Phase, Profile
from harness.profiles.locust_hook import expose
from loadprofiles._chat_mix import chat_classes

PROFILE = Profile(
    name="ramp",
    seed=44,
    description="rate 0.5 -> 8 req/s linearly over 60 s, then 15 s at 8 req/s (mixed classes)",
    classes=chat_classes(),
    phases=(
        Phase(name="ramp", duration_s=60, rate=0.5, rate_end=8.0),
        Phase(name="hold", duration_s=15, rate=8.0),
    ),
)

expose(PROFILE, globals())
