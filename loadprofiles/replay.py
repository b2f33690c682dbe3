"""`replay` — replays a request trace: exactly its arrival times and prompt/output
lengths, open loop (a `trace` phase).

What it is for: your own traffic instead of a synthetic mix — production logs, the
public Azure LLM inference traces, BurstGPT. Every policy sees the same arrivals the
trace recorded, bursts and lulls included, so the policy differences are the ones
your traffic would show.

The trace (environment variables, read when the profile loads; the Locust side can
set them from its command line):

- `SCHEDSCOPE_REPLAY_TRACE` — a CSV or JSONL file (`.jsonl`/`.ndjson`: JSONL, else
  CSV) in one of the layouts: Azure (`TIMESTAMP` datetime, `ContextTokens`,
  `GeneratedTokens`), BurstGPT (`Timestamp` seconds, `Request tokens`, `Response
  tokens`; `Model`/`Log Type` ignored unless filtered), or plain (`arrival_s` or
  `timestamp` seconds, `prompt_tokens`, `output_tokens`, optional `class`: `chat` or
  `long` here). Default: `replay_sample.csv` beside this file, a synthetic 120 s trace
  of 313 requests (plain layout; 85% chat, 15% long; ~2 req/s with a 10 s burst at
  ~10 req/s from t = 50 s; generated with numpy seed 2024, nothing downloaded).
- `SCHEDSCOPE_REPLAY_TIME_SCALE` — 2.0 replays twice as fast (default 1);
  `--rate-scale` multiplies it too.
- `SCHEDSCOPE_REPLAY_START_S` — skip the trace's first seconds (default 0);
  `SCHEDSCOPE_REPLAY_LIMIT` — keep at most this many requests.
- `SCHEDSCOPE_REPLAY_FORMAT` — auto (default), azure, burstgpt, plain;
  `SCHEDSCOPE_REPLAY_MODEL` / `SCHEDSCOPE_REPLAY_LOG_TYPE` — BurstGPT row filters.

Requests without a class column are `chat`. Each request asks for exactly the
trace's output length (max_tokens = output tokens; the Locust client sends
ignore_eos). Rows with 0 prompt or output tokens (BurstGPT's failures) are skipped.

Capacity it assumes: the sample trace averages ~2.6 req/s (peaking ~10 in its
burst) of lengths like the mixed profile's, inside what the served bundled engine
sustains on 2 cores (~13 req/s of mixed), its burst included: to load the engine,
compress time (`SCHEDSCOPE_REPLAY_TIME_SCALE` < 1 or `--rate-scale` > 1). Public traces are far
heavier and longer: Azure contexts reach thousands of tokens, past the default
--max-model-len 2048 (the engine rejects those requests, and the records say so) —
serve with a larger --max-model-len, or use --rate-scale / TIME_SCALE < 1 and
LIMIT to fit the machine. The sample's classes keep prompt + output <= 2048.

Simulator check (`schedscope simulate --profile replay --policy all`, sample trace,
built-in cost model): the sample is under capacity, so the three policies are
identical (queue-wait p99 under 0.06 s). With --rate-scale 8 (8x as fast): queue-wait
p99 chat / long fcfs 1.9 / 1.7 s, sjf 1.5 / 4.7 s, priority 0.7 / 3.3 s.
"""

import os
from pathlib import Path

from harness.loadgen.expose import expose
from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    ReplayTrace,
    RequestClass,
    Slo,
)

SAMPLE = Path(__file__).resolve().parent / "replay_sample.csv"


def _env(name: str, cast, default):
    value = os.environ.get(name)
    return default if value in (None, "") else cast(value)


TRACE = ReplayTrace(
    file=_env("SCHEDSCOPE_REPLAY_TRACE", str, str(SAMPLE)),
    format=_env("SCHEDSCOPE_REPLAY_FORMAT", str, "auto"),
    time_scale=_env("SCHEDSCOPE_REPLAY_TIME_SCALE", float, 1.0),
    start_s=_env("SCHEDSCOPE_REPLAY_START_S", float, 0.0),
    limit=_env("SCHEDSCOPE_REPLAY_LIMIT", int, None),
    model=_env("SCHEDSCOPE_REPLAY_MODEL", str, None),
    log_type=_env("SCHEDSCOPE_REPLAY_LOG_TYPE", str, None),
    default_class="chat",
)

# The classes name what the trace's requests are (priority, SLOs); their length
# distributions are not drawn from in a trace phase — the trace gives the lengths.
PROFILE = Profile(
    name="replay",
    seed=0,
    description=f"replay of {Path(TRACE.file).name} ({TRACE.num_requests} requests, "
    f"time scale {TRACE.time_scale:g})",
    classes=(
        RequestClass(
            name="chat",
            priority=0,
            prompt_tokens=LengthDistribution.lognormal(220, 0.6, max=1024),
            output_tokens=LengthDistribution.lognormal(80, 0.6, max=256),
            slo=Slo(ttft_s=1.0, tpot_s=0.1),
        ),
        RequestClass(
            name="long",
            priority=1,
            prompt_tokens=LengthDistribution.lognormal(600, 0.4, max=1024),
            output_tokens=LengthDistribution.lognormal(450, 0.4, max=1024),
            slo=Slo(ttft_s=5.0, e2e_s=90.0),
        ),
    ),
    phases=(Phase(name="trace", trace=TRACE),),
)

expose(PROFILE, globals())
