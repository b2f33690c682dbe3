"""`priority` — interactive vs batch: 70% interactive requests (priority 0, tight
TTFT/TPOT SLOs) and 30% batch jobs (priority 2, long prompts and outputs, only a
loose E2E SLO); steady 9 req/s for 60 s, a 20 s surge at 22 req/s, 40 s recovery.

What it is for: the policy difference `--policy priority` is meant to make. Under
the surge FCFS makes interactive requests queue behind batch prefills (their TTFT
SLO is missed); priority serves interactive first, at the cost of batch queue wait
(and, with `--aging-rate`/`--max-wait-s` off, batch can starve — trap 3: compare
with `--max-wait-s 20`). SJF does part of the same by length, without knowing
which class matters. Goodput per class is the number to read.

Capacity it assumes: the served bundled engine sustains ~13 req/s of the mixed
profile on 2 cores; this mix is heavier per request (batch: ~700-token prompts,
~300-token outputs), so 9 req/s is near its knee and the surge is well past it.
(4 and 10 req/s until the engine's prefill got ~2x faster, 2026-12-01.) Every class
keeps prompt max + max_tokens <= 2048 (the default --max-model-len).

Simulator check (`schedscope simulate --profile priority --policy all`, seed 46,
built-in cost model, 1,398 requests; queue-wait p99 interactive / batch): fcfs 6.8 /
6.7 s; sjf 0.8 / 32.2 s (batch max 38.6 s); priority 0.4 / 8.9 s (43 preemptions of
batch for interactive). Priority protects interactive better than SJF does, without
starving batch as badly.
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo

PROFILE = Profile(
    name="priority",
    seed=46,
    description="70% interactive (priority 0) / 30% batch (priority 2); 9 req/s, surge to 22",
    classes=(
        RequestClass(
            name="interactive",
            weight=0.7,
            priority=0,
            max_tokens=192,
            prompt_tokens=LengthDistribution.lognormal(150, 0.5, max=768),
            output_tokens=LengthDistribution.lognormal(60, 0.5),
            slo=Slo(ttft_s=0.5, tpot_s=0.1),
        ),
        RequestClass(
            name="batch",
            weight=0.3,
            priority=2,
            max_tokens=768,
            prompt_tokens=LengthDistribution.lognormal(700, 0.3, max=1280),
            output_tokens=LengthDistribution.lognormal(300, 0.4),
            slo=Slo(e2e_s=180.0),
        ),
    ),
    phases=(
        Phase(name="steady", duration_s=60, rate=9.0),
        Phase(name="surge", duration_s=20, rate=22.0),
        Phase(name="recovery", duration_s=40, rate=9.0),
    ),
)

expose(PROFILE, globals())
