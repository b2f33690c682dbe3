"""A load profile written in Python: `schedscope ... --profile default_py_example`.

A profile file exposes a module-level PROFILE, either a `Profile` or a dict in the
TOML shape (docs/profiles.md). This one mixes a closed loop (8 users, each sending
the next request as soon as the previous one finishes) with an open-loop tail.
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo

PROFILE = Profile(
    name="default_py_example",
    seed=7,
    description="closed loop of 8 users for 30 s, then 30 s of Poisson arrivals at 2 req/s",
    classes=(
        RequestClass(
            name="chat",
            weight=3.0,
            prompt_tokens=LengthDistribution.lognormal(150, 0.5, max=1024),
            output_tokens=LengthDistribution.geometric(60),
            max_tokens=256,
            slo=Slo(ttft_s=1.0, tpot_s=0.1),
        ),
        RequestClass(
            name="summarize",
            weight=1.0,
            prompt_tokens=LengthDistribution.uniform(800, 1500),
            output_tokens=LengthDistribution.normal(120, 30, max=256),
            max_tokens=256,
            priority=1,
            slo=Slo(e2e_s=30.0),
        ),
    ),
    phases=(
        Phase(name="closed", duration_s=30, concurrency=8),
        Phase(name="open", duration_s=30, rate=2.0, classes={"summarize": 0.0}),
    ),
)

expose(PROFILE, globals())
