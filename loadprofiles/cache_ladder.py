"""`cache_ladder` — one load at five prefix-reuse rungs: 0% (the control), 25%, 50%,
75% and 90% of every prompt's tokens repeating an earlier prompt's prefix.

What it is for: how much the prefix cache buys on this engine at each level of reuse,
the same arrivals and lengths otherwise, measured side by side (the report's cache
ladder table: TTFT p50/p95, throughput and hit rate per rung). The rungs are phases,
in that order; each rung's shared document is its own, so a rung finds nothing of the
one before it in the cache.

Traffic: Poisson 5 requests/s, 30 s per rung (at the 0% rung about 85% of the served
bundled engine's capacity on this mix on a 2-core AMD VM, 6 requests/s, so a queue can
form there; the higher rungs are the same arrivals made cheaper by the cache; at 10/s
that machine fell behind and left a backlog that every later rung inherited); one class, `doc_qa`:
prompts lognormal around 600 tokens (at most 1,500), ~40 output tokens (at most 128). A
rung's reuse is a phase's `prefix_reuse`: the first share of each prompt is the rung's
document.
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo

RUNGS = (0.0, 0.25, 0.5, 0.75, 0.9)

PROFILE = Profile(
    name="cache_ladder",
    seed=42,
    description="Poisson 5 req/s, 30 s at each prefix reuse: 0%, 25%, 50%, 75%, 90%",
    classes=(
        RequestClass(
            name="doc_qa",
            max_tokens=128,
            prompt_tokens=LengthDistribution.lognormal(600, 0.4, max=1500),
            output_tokens=LengthDistribution.lognormal(40, 0.5),
            slo=Slo(ttft_s=1.0),
        ),
    ),
    phases=tuple(
        Phase(name=f"reuse_{round(r * 100)}", duration_s=30, rate=5.0, prefix_reuse=r)
        for r in RUNGS
    ),
)

expose(PROFILE, globals())
