"""`agentic` — tool-call chains: an agent re-sends a context that grows with every tool
result, with short outputs (a tool call) and almost no think time.

What it is for: long, growing, cache-friendly contexts arriving back to back: the
prefix cache decides TTFT, and a chain's next turn arrives the moment the last ended,
so queueing compounds along the chain (the report's session duration shows it).

Traffic: chains arrive open-loop (Poisson 0.8/s for 90 s); one session class, `agent`:
a 300-token system prompt (the agent's instructions and tools), 3-8 turns, each new
message a tool result of ~80 tokens (at most 150), each answer a ~24-token tool call (at
most 48), think time uniform 0-50 ms (the tool's run). A chain's last turn holds at most
~1,900 tokens with its answer, within the default `--max-model-len` 2048.
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

PROFILE = Profile(
    name="agentic",
    seed=42,
    description="tool-call chains: 3-8 turns, growing contexts, ~24-token answers, no think time",
    classes=(
        RequestClass(
            name="agent",
            max_tokens=48,
            prompt_tokens=LengthDistribution.lognormal(80, 0.4, max=150),
            output_tokens=LengthDistribution.lognormal(24, 0.4),
            system_prompt=SystemPrompts(count=1, tokens=LengthDistribution.fixed(300)),
            session=Sessions(
                turns=LengthDistribution.uniform(3, 8),
                think_time_s=SecondsDistribution.uniform(0.0, 0.05),
            ),
            slo=Slo(ttft_s=0.5),
        ),
    ),
    phases=(Phase(name="steady", duration_s=90, rate=0.8),),
)

expose(PROFILE, globals())
