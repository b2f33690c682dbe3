"""`swap_pressure` — long contexts that overflow the KV pool and the swap space, so
both swap and recompute preemptions happen: 70% long-context requests (prompts of
1024-1536 tokens, outputs of 200-512) and 30% chat, Poisson at 3 req/s for 60 s.

What it is for: trap 2 in docs/traps.md (--swap-space too small: preemptions
fall back to recompute, which re-runs the prefill and shows up as multi-second
generation stalls) and the memory case (trap 4: KV pool full, a request needs
blocks — preempt by swap or by recompute, each a decision with its reason). It needs
a small KV pool and a smaller swap space; with the default pool (28,896 blocks in
the simulator) nothing is preempted at all.

Engine knobs it is meant for (`schedscope serve`/`simulate`):

    --num-gpu-blocks-override 384   # 6,144 KV tokens: three or four long requests
    --swap-space 0.004              # 131 host blocks (32 KiB each): one long request

`--gpu-memory-utilization` sizes the pool from device memory instead: lower it until
the pool holds a few long requests (the kv line of the run's summary says how many
blocks it got); the override is exact and the same on every machine. On a real vLLM
the same two knobs apply (`--num-gpu-blocks-override`, `--swap-space` in GiB).
`--preemption-mode swap` swaps until the host pool is full and then recomputes;
`auto` (default) picks per request by predicted cost while the host pool has room.

Capacity it assumes: 3 req/s of these lengths is ~1,900 prompt + ~420 output tokens a
second, within what the served bundled engine does on 2 cores (it sustains ~13 req/s
of the mixed profile's classes, see `mixed`); with the default pool the simulated
queue p99 stays under 0.4 s. (It was 2 req/s until the engine's prefill got ~2x
faster, 2026-12-01: at 2 req/s requests now finish before the small pool fills often
enough to force recomputes.) With the recommended knobs the small pool admits only a
few requests at a time, so the queue and the preemptions are memory's doing. Every
class keeps prompt max + max_tokens <= 2048 (1536 + 512: the default --max-model-len).

Measured (`schedscope simulate --profile swap_pressure --policy all
--num-gpu-blocks-override 384 --swap-space 0.004`, seed 5, built-in cost model, 184
requests; swap / recompute preemptions, queue-wait p99 of long_context / chat):

    fcfs       53 / 13    26.4 s / 24.3 s
    sjf        29 / 11    60.2 s /  0.3 s
    priority   41 / 17    27.2 s /  0.2 s

Shortened to --duration-scale 0.34 (20 s) every policy still both swaps and
recomputes; tests/harness/profiles/test_profile_library.py asserts it.
"""

from harness.loadgen.expose import expose
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, Slo

#: The knobs the docstring recommends, for tests and scripts.
ENGINE_KNOBS = {"num_gpu_blocks_override": 384, "swap_space": 0.004}

PROFILE = Profile(
    name="swap_pressure",
    seed=5,
    description="70% long contexts (1024-1536 prompt) / 30% chat at 3 req/s; "
    "run with --num-gpu-blocks-override 384 --swap-space 0.004",
    classes=(
        RequestClass(
            name="long_context",
            weight=0.7,
            priority=1,
            max_tokens=512,
            prompt_tokens=LengthDistribution.uniform(1024, 1536),
            output_tokens=LengthDistribution.uniform(200, 512),
            slo=Slo(ttft_s=5.0, e2e_s=120.0),
        ),
        RequestClass(
            name="chat",
            weight=0.3,
            priority=0,
            max_tokens=256,
            prompt_tokens=LengthDistribution.lognormal(200, 0.5, max=1024),
            output_tokens=LengthDistribution.lognormal(80, 0.5),
            slo=Slo(ttft_s=1.0, tpot_s=0.1),
        ),
    ),
    phases=(Phase(name="pressure", duration_s=60, rate=3.0),),
)

expose(PROFILE, globals())
