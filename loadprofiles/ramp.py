"""`ramp` — the arrival rate rises linearly from 0.5 to 24 req/s over 60 s, then holds
24 req/s for 15 s (mixed classes, Poisson: a `rate_end` phase).

What it is for: finding the knee — the rate at which queue wait and TTFT leave the
floor — in one run, and seeing which policy holds the short class's TTFT longest as
load passes capacity. Read latency against `scheduled_at` (the intended rate at t is
0.5 + 23.5 t / 60).

Capacity it assumes: the served bundled engine sustains ~13 req/s of the mixed classes
on 2 cores (see `mixed`), crossed at t ~ 32 s; the last ~25 s are up to 1.8x past it,
so a queue builds at the end. (0.5 -> 8 req/s until the engine's prefill got ~2x
faster, 2026-12-01.) Every class keeps prompt max + max_tokens <= 2048 (the default
--max-model-len).

Simulator check (`schedscope simulate --profile ramp --policy all`, seed 44, built-in
cost model, 1,144 requests): queue-wait p99 short / long fcfs 16.0 / 15.5 s, sjf
5.0 / 26.6 s, priority 1.2 / 21.6 s: past the knee SJF and priority hold the short
class's TTFT, FCFS does not.
"""

from harness.loadgen.expose import expose
from harness.profiles import Phase, Profile
from loadprofiles._chat_mix import chat_classes

PROFILE = Profile(
    name="ramp",
    seed=44,
    description="rate 0.5 -> 24 req/s linearly over 60 s, then 15 s at 24 req/s (mixed classes)",
    classes=chat_classes(),
    phases=(
        Phase(name="ramp", duration_s=60, rate=0.5, rate_end=24.0),
        Phase(name="hold", duration_s=15, rate=24.0),
    ),
)

expose(PROFILE, globals())
