"""`shared_prefix` — single-turn requests over a few shared system prompts, the popular
ones far more often (Zipf): the traffic of an API fronting several assistants.

What it is for: the prefix cache's hit rate when prefixes are shared but not all
equally (the popular prompts stay cached, the rare ones are evicted and recomputed
under pressure: the cache-thrash trap), and what `lpm` buys against fcfs.

Traffic: Poisson 6 requests/s for 90 s; one class, `api`: one of 8 system prompts
(lengths lognormal around 400 tokens, at most 800; prompt k drawn with probability
proportional to 1/(k+1)^1.1), then a ~100-token user part (at most 400), ~60 output
tokens (at most 200). Every request stays within the default `--max-model-len` 2048.
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo, SystemPrompts

PROFILE = Profile(
    name="shared_prefix",
    seed=42,
    description="single turns over 8 system prompts (Zipf 1.1); Poisson 6 req/s for 90 s",
    classes=(
        RequestClass(
            name="api",
            max_tokens=200,
            prompt_tokens=LengthDistribution.lognormal(100, 0.5, max=400),
            output_tokens=LengthDistribution.lognormal(60, 0.5),
            system_prompt=SystemPrompts(
                count=8,
                tokens=LengthDistribution.lognormal(400, 0.3, min=64, max=800),
                popularity="zipf",
                zipf_s=1.1,
            ),
            slo=Slo(ttft_s=1.0, tpot_s=0.1),
        ),
    ),
    phases=(Phase(name="steady", duration_s=90, rate=6.0),),
)

expose(PROFILE, globals())
