"""`spike` — steady 6.5 req/s for 40 s, one 2 s spike at 130 req/s (20x, 260 requests
at once), then 58 s of the steady rate again.

What it is for: the memory case (trap 4) and recovery. A spike admits far more
sequences than usual at once: with the default knobs the token budget caps each
step's prefill, so the spike turns into a queue (queue wait and TTFT jump, then
drain); with a small KV pool (`--num-gpu-blocks-override`) it shows which requests
each policy preempts, swaps or rejects, each a decision with its reason. How long
the steady traffic after the spike stays slow is the recovery time.

Capacity it assumes: the served bundled engine sustains ~13 req/s of these classes on
2 cores (see `mixed`): the steady rate is half of that; the spike is ten times past
it. (3 and 60 req/s until the engine's prefill got ~2x faster, 2026-12-01.) Short
chat only plus a few long generations (90/10), so the spike is about arrivals, not
lengths. Every class keeps prompt max + max_tokens <= 2048 (the default
--max-model-len).

Simulator check (`schedscope simulate --profile spike --policy all`, seed 45, built-in
cost model, 904 requests; queue-wait p99 short / long): fcfs 3.6 / 3.5 s; sjf 3.3 /
6.3 s; priority 2.5 / 5.3 s. No preemptions by memory at the default pool (priority
preempts two requests for better ones); the spike is a queue behind the running
batch that drains within ~4 s.
"""

from harness.loadgen.expose import expose
from harness.profiles import Phase, Profile
from loadprofiles._chat_mix import chat_classes

PROFILE = Profile(
    name="spike",
    seed=45,
    description="6.5 req/s steady; one 2 s spike at 130 req/s at t=40 s; 100 s in all",
    classes=chat_classes(0.9, 0.1),
    phases=(
        Phase(name="before", duration_s=40, rate=6.5),
        Phase(name="spike", duration_s=2, rate=130.0),
        Phase(name="after", duration_s=58, rate=6.5),
    ),
)

expose(PROFILE, globals())
