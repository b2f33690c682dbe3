"""A small profile for the load-generator tests: 2 s open loop, then a 1 s closed loop.

Run it like any profile: ``locust -f tests/data/locust_small.py --host URL --headless``.
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass

PROFILE = Profile(
    name="locust_small",
    seed=11,
    description="two classes; 2 s of Poisson arrivals at 20 req/s, then 3 users for 1 s",
    classes=(
        RequestClass(
            name="short_chat",
            weight=3.0,
            prompt_tokens=LengthDistribution.uniform(8, 64),
            output_tokens=LengthDistribution.uniform(2, 12),
            max_tokens=16,
        ),
        RequestClass(
            name="long_gen",
            weight=1.0,
            priority=1,
            prompt_tokens=LengthDistribution.uniform(100, 200),
            output_tokens=LengthDistribution.uniform(20, 40),
            max_tokens=64,
        ),
    ),
    phases=(
        Phase(name="open", duration_s=2.0, rate=20.0),
        Phase(name="closed", duration_s=1.0, concurrency=3),
    ),
)

expose(PROFILE, globals())
