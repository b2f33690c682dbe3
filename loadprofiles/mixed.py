"""`mixed` — the default profile (`default` is its alias): 80% short chat, 20% long
generation, Poisson arrivals with a burst.

What it is for: the everyday comparison of FCFS, SJF and priority on a chat-heavy
mix (`make demo`). The burst builds a queue, so the policies differ: SJF and
priority cut the short class's queue wait and TTFT and push the wait onto the long
class (trap 3, mild here; `starvation` is the sustained version).

Capacity it assumes: the served bundled engine (`schedscope serve --executor torch`,
tiny model, 2 CPU cores, engine process with 1 torch thread) sustains about 13
requests/s of this mix (mean output ~160 tokens: ~2,100 output tokens/s): Poisson
arrivals of it in the simulator at the built-in cost model (fitted from served runs,
within 7% of them at this profile's rate) keep TTFT p50 under 60 ms up to 12 req/s,
140 ms at 14 and let the queue grow without bound at 16 (2026-12-01). Base rate:
6 requests/s (steady and recovery), under half of that; the burst runs at 7x the base
(42 requests/s, burstiness 0.3) for 15 s, about 3x capacity and past the default
--max-num-seqs (256 running), so a queue forms and the policies differ. (The rates
were 4 and 28 req/s until grouped prefill attention and kept host memory made the
engine ~2x faster: at those rates the burst fitted in the running batch and no queue
formed.) Scale every rate at once with --rate-scale (Profile.with_rate_scale), every
duration with --duration-scale. Every class keeps prompt max + max_tokens <= 2048 (the
engine's default max_model_len).

Simulator check (`schedscope simulate --profile mixed --policy all`, built-in cost
model, seed 42, 1,164 requests): queue-wait p99 of the short class 7.1 s (fcfs) /
3.2 s (sjf) / 1.4 s (priority); of the long class 6.7 / 14.6 / 11.0 s.
"""

from harness.loadgen.expose import expose
from harness.profiles import Phase, Profile
from loadprofiles._chat_mix import chat_classes

PROFILE = Profile(
    name="mixed",
    seed=42,
    description=(
        "80% short chat / 20% long generation; steady 60 s at 6 req/s, "
        "15 s burst at 42 req/s, recovery 45 s"
    ),
    classes=chat_classes(),
    phases=(
        Phase(name="steady", duration_s=60, rate=6.0, burstiness=1.0),
        Phase(name="burst", duration_s=15, rate=42.0, burstiness=0.3),
        Phase(name="recovery", duration_s=45, rate=6.0, burstiness=1.0),
    ),
)

expose(PROFILE, globals())
