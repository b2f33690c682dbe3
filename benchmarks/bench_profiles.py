"""Profile sampling speed: the bounds that used to be asserted inside
tests/harness/profiles/test_profiles.py.

Targets: 100,000 draws from each of the seven length-distribution kinds in <= 0.5 s
all together; `sample_requests` of 100,000 requests of the default profile in <= 2 s.
Each figure is the median of --repeats runs.

Run: .venv/bin/python benchmarks/bench_profiles.py [--requests 100000] [--repeats 5]
     [--quick: 3 repeats] [--json FILE]
Prints the measured figure beside the target; never fails on time (machines are shared).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.profiles import LengthDistribution, resolve_profile, sample_requests

TARGET_DISTRIBUTIONS_S = 0.5
TARGET_SAMPLE_REQUESTS_S = 2.0

# One of each kind, with the parameters the old unit test used.
DISTRIBUTIONS = {
    "fixed": LengthDistribution.fixed(3),
    "uniform": LengthDistribution.uniform(1, 9),
    "normal": LengthDistribution.normal(50, 5),
    "lognormal": LengthDistribution.lognormal(200, 0.6),
    "exponential": LengthDistribution.exponential(50),
    "geometric": LengthDistribution.geometric(50),
    "empirical": LengthDistribution.empirical(list(range(1, 1000))),
}


def median_seconds(work: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def verdict(measured: float, target: float) -> str:
    return "MET" if measured <= target else "MISSED"


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--profile", default="default")
    parser.sized("--repeats", type=int, full=5, quick=3)
    return parser


def run(args) -> list[Figure]:

    rng = np.random.default_rng(0)
    total = 0.0
    print(f"length distributions, {args.draws:,} draws each (median of {args.repeats}):")
    for kind, dist in DISTRIBUTIONS.items():
        seconds = median_seconds(lambda d=dist: d.sample(rng, args.draws), args.repeats)
        total += seconds
        print(f"  {kind:12} {seconds * 1e3:8.2f} ms")
    # The target is per 100,000 draws; scale when --draws differs.
    scaled = total * 100_000 / args.draws
    print(
        f"  all kinds: measured {scaled:.3f} s per 100,000 draws each "
        f"beside target <= {TARGET_DISTRIBUTIONS_S} s   "
        f"{verdict(scaled, TARGET_DISTRIBUTIONS_S)}"
    )
    distributions = Figure(
        "100,000 draws of each length distribution kind",
        scaled,
        "s",
        TARGET_DISTRIBUTIONS_S,
        note=f"all seven kinds together; median of {args.repeats}",
    )

    profile = resolve_profile(args.profile)
    seconds = median_seconds(lambda: sample_requests(profile, args.requests), args.repeats)
    scaled = seconds * 100_000 / args.requests
    print(
        f"sample_requests(profile={profile.name}, n={args.requests:,}): "
        f"{seconds:.3f} s ({args.requests / seconds:,.0f} requests/s)"
    )
    print(
        f"  measured {scaled:.3f} s per 100,000 requests beside target "
        f"<= {TARGET_SAMPLE_REQUESTS_S} s   {verdict(scaled, TARGET_SAMPLE_REQUESTS_S)}"
    )
    sampling = Figure(
        "sample_requests per 100,000 requests",
        scaled,
        "s",
        TARGET_SAMPLE_REQUESTS_S,
        note=f"profile {profile.name}, {args.requests:,} sampled; median of {args.repeats}",
    )
    return [distributions, sampling]


if __name__ == "__main__":
    bench_main(parser, run)
