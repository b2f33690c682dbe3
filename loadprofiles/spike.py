"""`spike` — steady 3 req/s for 40 s, one 2 s spike at 60 req/s (20x, 120 requests at
once), then 58 s of the steady rate again.

What it is for: the memory case (trap 4) and recovery. A spike admits far more
sequences than usual at once: with the default knobs the token budget caps each
step's prefill, so the spike turns into a queue (queue wait and TTFT jump, then
drain); with a small KV pool (`--num-gpu-blocks-override`) it shows which requests
each policy preempts, swaps or rejects, each a decision with its reason. How long
the steady traffic after the spike stays slow is the recovery time.

Capacity it assumes: the served bundled engine sustains ~6 req/s of these classes on
2 cores (see `mixed`): the steady rate is half of that; the spike is ten times past
it. Short chat only plus a few long generations (90/10), so the spike is about
arrivals, not lengths. Every class keeps prompt max + max_tokens <= 2048 (the
default --max-model-len).

Simulator check (`schedscope simulate --profile spike --policy all`, seed 45, built-in
cost model, 429 requests; queue-wait p99 short / long, TTFT p99 all): fcfs 5.2 /
4.7 s, 6.3 s; sjf 2.4 / 4.3 s, 3.9 s; priority 3.8 / 7.4 s, 8.0 s. No preemptions
at the default pool; the spike is a token-budget queue (fcfs: waits up to 5.8 s).
"""

from harness.profiles import Phase, Profile
from harness.profiles.locust_hook import expose
from loadprofiles._chat_mix import chat_classes

PROFILE = Profile(
    name="spike",
    seed=45,
    description="3 req/s steady; one 2 s spike at 60 req/s at t=40 s; 100 s in all",
    classes=chat_classes(0.9, 0.1),
    phases=(
        Phase(name="before", duration_s=40, rate=3.0),
        Phase(name="spike", duration_s=2, rate=60.0),
        Phase(name="after", duration_s=58, rate=3.0),
    ),
)

expose(PROFILE, globals())
