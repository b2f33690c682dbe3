"""`chat_sessions` — multi-turn chat: conversations under two tenants' system prompts,
each turn sent a few seconds after the previous answer, with the whole conversation.

What it is for: the prefix cache's biggest effect (later turns re-send everything
before them) and how the policies compare on it, `lpm` (longest cached prefix first)
beside fcfs, sjf and priority. The report shows TTFT and the hit rate by turn (the
first turn against the later ones), session completion and session duration.

Traffic: sessions arrive open-loop (Poisson, 1 session/s for 60 s, then a 15 s surge at
25/s, then 30 s at 1/s); two session classes, one per tenant: `support` (priority 0, a
400-token system prompt, 2-5 turns) and `assistant` (priority 1, a 250-token system
prompt, 2-5 turns). Each turn's new message is ~60 tokens, its answer ~80 (at most
128), the think time between an answer and the next turn exponential with a 3 s mean
(at most 15 s). A session's last turn holds at most ~1,650 tokens with its answer,
within the default `--max-model-len` 2048.

Capacity it assumes: about 3.4 turns per session at 1 session/s is ~3.4 requests/s, a
fifth of what the engine sustains on this mix (~19 requests/s in the simulator at the
built-in cost model; later turns are mostly cache hits); the surge brings ~85 turns/s
for 15 s, past the running batch, so a queue forms and the policies differ (simulated,
seed 42: fcfs keeps every class's TTFT p95 near 1.1 s; sjf and priority favour one
tenant; lpm serves the later turns, whose conversations are cached, in 0.25-0.8 s and
leaves the colder first turns of the tenant with the shorter system prompt waiting:
5.8 s at p95). Served at 1x on a 2-core VM whose engine completes ~10 turns/s of this mix
(`benchmarks/bench_sessions.py`, fcfs, 2026-12-07): later turns hit 88.6%, TTFT p50
0.5-0.8 s and E2E p50 18 s; with --no-enable-prefix-caching TTFT p50 12.7 s and E2E p50
43 s. That machine takes minutes to drain the surge: on a slower one, or to compare
policies near (not far past) capacity, use --rate-scale auto (sessions per second
scaled to 80% of the engine's capacity on the mix) or --rate-scale F.
"""

from harness.loadgen.expose import expose
from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    RequestClass,
    SecondsDistribution,
    Sessions,
    Slo,
    SystemPrompts,
)

SESSION = Sessions(
    turns=LengthDistribution.uniform(2, 5),
    think_time_s=SecondsDistribution.exponential(3.0, max=15.0),
)


def _tenant(name: str, priority: int, system_tokens: int) -> RequestClass:
    return RequestClass(
        name=name,
        weight=1.0,
        priority=priority,
        max_tokens=128,
        prompt_tokens=LengthDistribution.lognormal(60, 0.5, max=150),
        output_tokens=LengthDistribution.lognormal(80, 0.4),
        system_prompt=SystemPrompts(count=1, tokens=LengthDistribution.fixed(system_tokens)),
        session=SESSION,
        slo=Slo(ttft_s=1.0, tpot_s=0.1),
    )


PROFILE = Profile(
    name="chat_sessions",
    seed=42,
    description=(
        "multi-turn chat under two tenants' system prompts: 2-5 turns, 3 s think times; "
        "1 session/s, a 15 s surge at 25/s"
    ),
    classes=(_tenant("support", 0, 400), _tenant("assistant", 1, 250)),
    phases=(
        Phase(name="steady", duration_s=60, rate=1.0),
        Phase(name="surge", duration_s=15, rate=25.0),
        Phase(name="recovery", duration_s=30, rate=1.0),
    ),
)

expose(PROFILE, globals())
