"""The load generator's memory when a target claims millions of tokens per request.

A hostile target (tests/support/hostile_target.py, mode ``completion_tokens_huge``)
answers every request with a stream whose every chunk's usage says ``completion_tokens:
3000000``. The load generator itself (Locust headless, one process, as ``schedscope run``
starts it) sends an open-loop profile of about ``--requests`` streamed completions of
``--max-tokens`` tokens over 2 s; the Locust process's peak resident memory
(``ru_maxrss``, read by a wrapper process that only waits for it) is the figure, and
the same run against a correct stream (mode ``good``) is printed beside it. The target
paces its chunks 20 ms apart, so the requests are in flight together. Targets: at most
400 MB, and at most 50 MB over the correct run's. Before the client bounded the counts,
the claimed count was counted as tokens (``itl_s`` grew to 3,000,002 entries per
request): 288 MB (+217 MB) for 11 requests, 610 MB (+539 MB) for 32, measured here
(2-core VM); the generator of a whole ``schedscope run`` had reached 2.8 GB. The rows'
longest ``itl_s`` is printed against ``max_tokens - 1``, what a row may hold whatever a
target claims.

Run: .venv/bin/python benchmarks/bench_hostile_usage.py [--requests 32] [--max-tokens 64]
     [--quick: 11 requests] [--json FILE]   (about 20 s)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

REPO = Path(__file__).resolve().parents[1]
LOCUST = str(Path(sys.executable).parent / "locust")
TARGET_MB = 400.0
#: the hostile run may hold no more than this over the correct one (every claimed token
#: held as an inter-token gap: ~24 MB per request in flight)
TARGET_GROWTH_MB = 50.0
HOSTILE = "completion_tokens_huge"

#: Runs the command given and prints its peak RSS: this process's only child, so
#: RUSAGE_CHILDREN's maximum is that child's.
WRAPPER = """
import json, resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(json.dumps({"rc": rc, "peak_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

#: The profile: about REQUESTS arrivals, evenly spaced over 2 s, MAX_TOKENS tokens each.
PROFILE = """
from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass

PROFILE = Profile(
    name="hostile_usage",
    seed=1,
    description="bench_hostile_usage: evenly spaced streamed completions",
    classes=(
        RequestClass(
            name="c",
            weight=1.0,
            prompt_tokens=LengthDistribution.fixed(16),
            output_tokens=LengthDistribution.fixed({max_tokens}),
            max_tokens={max_tokens},
        ),
    ),
    phases=(Phase(name="open", duration_s=2.0, rate={rate}, burstiness=1000.0),),
)

expose(PROFILE, globals())
"""


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--requests", type=int, full=32, quick=11, help="streamed requests at once")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens asked per request")
    return parser


def generate(mode: str, requests: int, max_tokens: int) -> dict:
    """One Locust run against the target in ``mode``: its peak RSS and its rows."""
    sys.path.insert(0, str(REPO))
    from tests.support.hostile_target import HostileTarget  # the tests' hostile server

    # 20 ms between chunks: a request streams for longer than the arrivals' spacing, so
    # the requests are in flight together (a generator holds every row in flight)
    with HostileTarget((mode,), pace_s=0.02) as target, tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "hostile_usage.py"
        # arrivals 1/rate apart from 1/rate on: ``requests`` of them within the 2 s
        rate = (requests + 0.5) / 2.0
        profile.write_text(PROFILE.format(max_tokens=max_tokens, rate=rate))
        records = Path(tmp) / "records"
        command = [LOCUST, "-f", str(profile), "--host", target.url, "--headless"]
        command += ["--only-summary", "--records-dir", str(records), "--grace", "10"]
        proc = subprocess.run(
            [sys.executable, "-c", WRAPPER, *command],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        rows = [
            json.loads(line)
            for path in records.glob("client-*.jsonl")
            for line in path.read_text().splitlines()
        ]
    if got["rc"] not in (0, 1) or not rows:  # 1: some requests failed (the hostile ones)
        raise RuntimeError(f"Locust exited {got['rc']} with {len(rows)} rows: {proc.stderr}")
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {
        "peak_rss_kb": got["peak_rss_kb"],
        "statuses": statuses,
        "longest_itl": max(len(row["itl_s"]) for row in rows),
        "errors": sorted({row["error"] for row in rows if row["error"]})[:3],
    }


def run(args) -> list[Figure]:
    good = generate("good", args.requests, args.max_tokens)
    hostile = generate(HOSTILE, args.requests, args.max_tokens)
    note = f"about {args.requests} requests of {args.max_tokens} tokens at once, Locust"
    good_mb, hostile_mb = good["peak_rss_kb"] / 1024, hostile["peak_rss_kb"] / 1024
    for label, got in (("a correct target", good), ("completion_tokens 3000000", hostile)):
        print(
            f"{label}: rows {got['statuses']}, longest itl_s {got['longest_itl']} "
            f"(max_tokens - 1 = {args.max_tokens - 1})"
        )
        for error in got["errors"]:
            print(f"  {error}")
    print(f"generator peak RSS, a correct target: {good_mb:.0f} MB")
    print(
        f"generator peak RSS, completion_tokens 3000000: {hostile_mb:.0f} MB   target <= "
        f"{TARGET_MB:.0f} MB (was 288 MB for 11 requests, 610 MB for 32)"
    )
    print(
        f"  over the correct target's: {hostile_mb - good_mb:+.0f} MB   target <= "
        f"{TARGET_GROWTH_MB:.0f} MB (was +217 MB, +539 MB)"
    )
    return [
        Figure("generator peak RSS, a correct target", good_mb, "MB", note=note),
        Figure(
            "generator peak RSS, completion_tokens 3000000", hostile_mb, "MB", TARGET_MB, note=note
        ),
        Figure(
            "generator peak RSS over a correct target's",
            hostile_mb - good_mb,
            "MB",
            TARGET_GROWTH_MB,
            note=note,
        ),
        Figure(
            "longest itl_s, completion_tokens 3000000",
            hostile["longest_itl"],
            "entries",
            args.max_tokens - 1,
            note=f"max_tokens {args.max_tokens}; was 3,000,002",
        ),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
