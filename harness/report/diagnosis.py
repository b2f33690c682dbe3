"""Diagnosis of the five known traps (docs/traps.md) from a run's data.

Each rule reads numbers the records carry, flags only past its thresholds (a healthy
run flags nothing), and states its evidence, the worst requests and the knob:

1. ``idle_running`` — running sequences left out of steps: idle-running sequence-steps
   ≥ ``IDLE_SHARE`` of running sequence-steps and ≥ ``IDLE_MIN_SEQ_STEPS``, mostly for
   the token budget (when decisions say why). Knob: ``--max-num-batched-tokens``.
2. ``swap_fallback`` — preemptions that wanted to swap but fell back to recompute
   because the host pool was full (``detail = swap_space_exhausted``): any. Knob:
   ``--swap-space``.
3. ``starvation`` — under ``sjf``/``priority``: long-class p99 queue wait ≥
   ``STARVATION_RATIO`` × the short class's and ≥ ``STARVATION_MIN_S``, and (when the
   run has FCFS) ≥ ``STARVATION_VS_FCFS`` × FCFS's long-class p99. Knob:
   ``--aging-rate`` / ``--max-wait-s``.
4. ``memory_pressure`` — any ``exceeds_kv_pool`` rejection, or ``out_of_blocks``
   preemptions of ≥ ``PREEMPT_SHARE`` of the requests. Knob:
   ``--gpu-memory-utilization`` / ``--num-gpu-blocks-override``, ``--max-num-seqs``.
5. ``cache_thrash`` — prefix caching on, and the prompt tokens the first admissions
   found evicted from the prefix cache (held before, lost for want of room) ≥
   ``THRASH_SHARE`` of the tokens they asked it for and ≥ ``THRASH_MIN_TOKENS``, with
   blocks evicted. Evidence adds the hit rate of the requests admitted at the lighter
   and the heavier load (:func:`load_halves`). Knob: ``--num-gpu-blocks-override`` /
   ``--gpu-memory-utilization``, ``--max-num-seqs``; its finding also carries
   ``command``, the ``schedscope simulate`` line of the cell with
   ``THRASH_POOL_FACTOR`` × its device blocks (:func:`simulate_command`).

A cell whose engine recorded none of the facts the rules read (:func:`unknown_facts`: an
external engine's ``--target`` cell) is not diagnosed: its facts would all read 0 for
want of a record, and no trap found there is not evidence that none happened."""

from __future__ import annotations

import re
import shlex

import polars as pl

from harness.report import prefix_cache
from harness.report.inputs import PolicyData
from harness.report.stats import clean
from harness.report.tables import ENGINE_COUNTS

IDLE_SHARE = 0.05
IDLE_MIN_SEQ_STEPS = 100
STARVATION_RATIO = 4.0
STARVATION_MIN_S = 2.0
STARVATION_VS_FCFS = 2.0
#: An aging rate to start from, in the unit of each policy's key: SJF's key is a size in
#: tokens, priority's a level. (0.1 tokens per second changes nothing under SJF; on the
#: starvation profile 100 clears the trap.)
AGING_EXAMPLES = {
    "sjf": "100: tokens of size forgiven per second waited",
    "priority": "0.1: priority levels per second waited",
}
PREEMPT_SHARE = 0.02
#: Trap 5: evicted-prefix tokens at least this share of the tokens the admissions asked
#: the prefix cache for ...
THRASH_SHARE = 0.10
#: ... and at least this many (a few evictions of a small run are not a trap).
THRASH_MIN_TOKENS = 1000
#: The pool trap 5's command simulates: this many times the run's device blocks.
THRASH_POOL_FACTOR = 2
WORST = 5


#: Why a cell is not diagnosed (:func:`unknown_facts`).
NO_ENGINE_FACTS = "no engine-side records (decisions, steps)"


def unknown_facts(data: PolicyData) -> str | None:
    """Why the trap rules cannot be applied to the cell, or None when they can: it has no
    steps.parquet, no decisions (decisions.parquet, or spans carrying the engine's
    decisions) and no engine count in its request rows (preemptions, idle running steps:
    :data:`harness.report.tables.ENGINE_COUNTS`), so every fact :func:`engine_facts`
    reads would be 0 for want of a record (an external engine's cell)."""
    if data.steps is not None or data.decisions is not None:
        return None
    if data.spans is not None and "attr.schedscope.decision" in data.columns("spans"):
        return None
    counted = [c for c in ENGINE_COUNTS if c in data.columns("requests")]
    if counted:
        recorded = data.requests.select(
            pl.any_horizontal([pl.col(c).is_not_null().any() for c in counted])
        ).collect()
        if recorded.item():
            return None
    return NO_ENGINE_FACTS


def engine_facts(data: PolicyData, frame: pl.DataFrame) -> dict:
    """Counts the rules read: from steps.parquet, decisions.parquet (spans, else the
    request rows, where decisions are missing)."""
    facts: dict = {"sources": {}}
    if data.steps is not None:
        s = (
            data.steps.select(
                pl.col("num_idle_running").sum().alias("idle_seq_steps"),
                pl.col("num_running").sum().alias("running_seq_steps"),
                (pl.col("num_idle_running") > 0).sum().alias("steps_with_idle"),
                pl.len().alias("num_steps"),
                (1 - pl.col("num_free_device_blocks") / pl.col("num_device_blocks"))
                .max()
                .alias("max_kv_usage"),
                pl.col("num_device_blocks").max().alias("num_device_blocks"),
                pl.col("num_free_host_blocks").min().alias("min_free_host_blocks"),
                pl.col("num_swapped").max().alias("max_swapped"),
                pl.col("num_waiting").max().alias("max_waiting"),
            )
            .collect()
            .row(0, named=True)
        )
        facts.update({k: clean(v) for k, v in s.items()})
        facts["sources"]["steps"] = "steps.parquet"
    else:
        facts["idle_seq_steps"] = int(frame["idle_running_steps"].sum())
        facts["sources"]["steps"] = "requests.parquet (idle_running_steps)"
    counts = None
    if data.decisions is not None:
        names = data.columns("decisions")
        cols = [
            pl.col(c) if c in names else pl.lit(None, pl.String).alias(c)
            for c in ("kind", "reason", "mode", "detail")
        ]
        counts = (
            data.decisions.select(cols).group_by("kind", "reason", "mode", "detail").len().collect()
        )
        facts["sources"]["decisions"] = "decisions.parquet"
    elif data.spans is not None:
        names = data.columns("spans")

        def col(c):
            return pl.col(c) if c in names else pl.lit(None, pl.String).alias(c)

        counts = (
            data.spans.filter(
                pl.col("attr.schedscope.decision").is_not_null()
                if "attr.schedscope.decision" in names
                else pl.lit(False)
            )
            .select(
                col("attr.schedscope.decision").alias("kind"),
                col("attr.schedscope.reason").alias("reason"),
                col("attr.schedscope.preempt.mode").alias("mode"),
                col("attr.schedscope.detail").alias("detail"),
            )
            .group_by("kind", "reason", "mode", "detail")
            .len()
            .collect()
        )
        facts["sources"]["decisions"] = "spans.parquet"
    if counts is not None:

        def n(**match) -> int:
            sel = counts
            for k, v in match.items():
                sel = sel.filter(pl.col(k) == v)
            return int(sel["len"].sum())

        facts["preemptions_by_reason"] = {
            r: int(c)
            for r, c in counts.filter(pl.col("kind") == "preempt")
            .group_by("reason")
            .agg(pl.col("len").sum())
            .iter_rows()
        }
        facts["preemptions_by_mode"] = {
            m or "unknown": int(c)
            for m, c in counts.filter(pl.col("kind") == "preempt")
            .group_by("mode")
            .agg(pl.col("len").sum())
            .iter_rows()
        }
        facts["rejections_by_reason"] = {
            r: int(c)
            for r, c in counts.filter(pl.col("kind") == "reject")
            .group_by("reason")
            .agg(pl.col("len").sum())
            .iter_rows()
        }
        facts["idle_running_by_reason"] = {
            r: int(c)
            for r, c in counts.filter(pl.col("kind") == "idle_running")
            .group_by("reason")
            .agg(pl.col("len").sum())
            .iter_rows()
        }
        facts["swap_fallbacks"] = n(kind="preempt", mode="recompute", detail="swap_space_exhausted")
        facts["out_of_blocks_preemptions"] = n(kind="preempt", reason="out_of_blocks")
        facts["waits_by_reason"] = {
            r: int(c)
            for r, c in counts.filter(pl.col("kind") == "wait")
            .group_by("reason")
            .agg(pl.col("len").sum())
            .iter_rows()
        }
    else:
        facts["sources"]["decisions"] = "requests.parquet (no decisions or spans)"
        facts["preemptions_by_mode"] = {
            "swap": int(frame["preempt_swaps"].sum()),
            "recompute": int(frame["preempt_recomputes"].sum()),
        }
        rej = frame.filter(pl.col("status") == "rejected").group_by("error").len()
        facts["rejections_by_reason"] = {r or "unknown": int(c) for r, c in rej.iter_rows()}
        facts["out_of_blocks_preemptions"] = int(frame["preemptions"].sum())
    facts.update(_prefix_facts(data, frame, facts["sources"]))
    return {k: v for k, v in facts.items()}


#: The first admissions' prefix-cache counts in decisions.parquet (``admit`` rows).
_PREFIX_DECISION_COLUMNS = ("num_tokens", "num_cached_tokens", "num_evicted_prefix_tokens")


def _prefix_facts(data: PolicyData, frame: pl.DataFrame, sources: dict) -> dict:
    """What trap 5 reads: the tokens the admissions asked the prefix cache for
    (``prefix_queried_tokens``), found there (``prefix_cached_tokens``) and found
    evicted (``evicted_prefix_tokens``) at each request's first admission (``admit`` in
    decisions.parquet, else requests.parquet); the blocks evicted (``evicted_blocks``,
    steps.parquet). A count no record holds is left out (unknown), never 0. Recomputes
    are left out: a preempted request whose own blocks were evicted before it came back
    is the cost of traps 2 and 4 (its recomputed tokens), not of prefixes shared with
    others."""
    out: dict = {}
    if data.steps is not None and "num_evicted_blocks" in data.columns("steps"):
        blocks = data.steps.select(pl.col("num_evicted_blocks").sum()).collect().item()
        out["evicted_blocks"] = int(blocks or 0)
    names = data.columns("decisions")
    if data.decisions is not None and all(c in names for c in _PREFIX_DECISION_COLUMNS):
        row = (
            data.decisions.filter(pl.col("kind") == "admit")
            .select(pl.col(c).sum() for c in _PREFIX_DECISION_COLUMNS)
            .collect()
            .row(0)
        )
        queried, cached, evicted = (int(v or 0) for v in row)
        sources["prefix_cache"] = "decisions.parquet (admit)"
    else:
        rows = prefix_cache.admitted_known(frame).filter(
            pl.col("evicted_prefix_tokens").is_not_null()
        )
        if rows.height == 0:
            return out
        queried = int(rows["prompt_tokens"].sum())
        cached = int(rows["cached_tokens"].sum())
        evicted = int(rows["evicted_prefix_tokens"].sum())
        sources["prefix_cache"] = "requests.parquet (first admissions)"
    out.update(
        prefix_queried_tokens=queried,
        prefix_cached_tokens=cached,
        evicted_prefix_tokens=evicted,
    )
    return out


def _worst(frame: pl.DataFrame, column: str, extra: tuple[str, ...] = ()) -> list[dict]:
    rows = frame.filter(pl.col(column) > 0).sort(column, descending=True).head(WORST)
    return [
        {k: clean(v) for k, v in r.items()}
        for r in rows.select("request_id", "class", column, *extra).iter_rows(named=True)
    ]


def _token_budget(config: dict) -> int | None:
    sched = config.get("scheduler") or {}
    if sched.get("max_num_batched_tokens"):
        return int(sched["max_num_batched_tokens"])
    if sched:
        return (
            2048
            if sched.get("enable_chunked_prefill", True)
            else max(int(sched.get("max_model_len") or 2048), 2048)
        )
    return None


def diagnose(
    data: PolicyData,
    frame: pl.DataFrame,
    stalls: pl.DataFrame,
    groups: dict,
    starvation: dict | None,
    facts: dict,
    fcfs_long_p99: float | None,
    rerun: dict | None = None,
) -> list[dict]:
    """The traps this policy's data shows (an empty list on a healthy run). ``rerun``:
    what a command that reruns the cell needs (:func:`rerun_info`: its profile, seed,
    rate and duration scales)."""
    findings: list[dict] = []
    sched = data.config.get("scheduler") or {}
    cache = data.config.get("cache") or {}
    by_cause = stalls.group_by("cause").agg(
        pl.len().alias("n"), pl.col("duration_s").sum().alias("t")
    )
    cause = {c: (int(n), float(t)) for c, n, t in by_cause.iter_rows()}

    # 1. idle running sequences (token budget too small for max_num_seqs)
    idle = facts.get("idle_seq_steps") or 0
    running = facts.get("running_seq_steps") or 0
    share = idle / running if running else (1.0 if idle else 0.0)
    reasons = facts.get("idle_running_by_reason") or {}
    budget_share = (reasons.get("token_budget", 0) / sum(reasons.values())) if reasons else 1.0
    if idle >= IDLE_MIN_SEQ_STEPS and share >= IDLE_SHARE and budget_share >= 0.5:
        budget, seqs = _token_budget(data.config), sched.get("max_num_seqs")
        findings.append(
            {
                "trap": "idle_running",
                "policy": data.policy,
                "run": data.run,
                "title": "Running sequences left idle by the token budget",
                "evidence": {
                    "idle_running_seq_steps": idle,
                    "running_seq_steps": running,
                    "idle_share": clean(share),
                    "steps_with_idle": facts.get("steps_with_idle"),
                    "idle_running_decisions_by_reason": reasons,
                    "token_budget_stalls": cause.get("token_budget", (0, 0.0))[0],
                    "token_budget_stall_s": clean(cause.get("token_budget", (0, 0.0))[1]),
                    "max_num_seqs": seqs,
                    "max_num_batched_tokens": budget,
                },
                "worst_requests": _worst(frame, "idle_running_steps", ("e2e_s",)),
                "knob": (
                    f"--max-num-batched-tokens (now {budget}) at least --max-num-seqs "
                    f"(now {seqs}) plus the prefill chunk you want per step, or lower "
                    "--max-num-seqs"
                ),
                "message": (
                    f"{share:.0%} of running sequence-steps ({idle:,}) were idle: admitted "
                    "requests held KV blocks but the token budget left them out of steps."
                ),
            }
        )

    # 2. swap space exhausted: preemptions fell back to recompute
    fallbacks = facts.get("swap_fallbacks") or 0
    if fallbacks > 0:
        n, t = cause.get("recompute", (0, 0.0))
        findings.append(
            {
                "trap": "swap_fallback",
                "policy": data.policy,
                "run": data.run,
                "title": "Preemptions fell back to recompute: swap space full",
                "evidence": {
                    "swap_fallbacks": fallbacks,
                    "preemptions_by_mode": facts.get("preemptions_by_mode"),
                    "recomputed_tokens": int(frame["recomputed_tokens"].sum()),
                    "recompute_stalls": n,
                    "recompute_stall_s": clean(t),
                    "min_free_host_blocks": facts.get("min_free_host_blocks"),
                    "swap_space_gib": cache.get("swap_space"),
                },
                "worst_requests": _worst(
                    frame, "recomputed_tokens", ("preempt_recomputes", "stall_s")
                ),
                "knob": (
                    f"--swap-space (now {cache.get('swap_space')} GiB) so swaps fit, or "
                    "--preemption-mode recompute if re-prefill is cheap for your prompts"
                ),
                "message": (
                    f"{fallbacks} preemptions wanted to swap but the host pool was full, so "
                    f"they re-ran the prefill: {n} recompute stalls, {t:.2f} s in total."
                ),
            }
        )

    # 3. long-class starvation under SJF / priority
    policy_name = sched.get("scheduling_policy") or data.policy
    if starvation and policy_name in ("sjf", "priority"):
        ratio = starvation.get("ratio_p99_queue")
        long_p99 = starvation.get("long_p99_queue_s") or 0.0
        vs_fcfs = fcfs_long_p99 is None or long_p99 >= STARVATION_VS_FCFS * max(fcfs_long_p99, 1e-9)
        if (
            ratio is not None
            and ratio >= STARVATION_RATIO
            and long_p99 >= STARVATION_MIN_S
            and vs_fcfs
        ):
            aging, max_wait = sched.get("aging_rate") or 0.0, sched.get("max_wait_s")
            long_rows = frame.filter(pl.col("class") == starvation["long_class"])
            knob = (
                f"--aging-rate (e.g. --aging-rate {AGING_EXAMPLES[policy_name]}) or "
                "--max-wait-s (e.g. the long class's TTFT SLO)"
                if not aging and max_wait is None
                else f"aging is on (--aging-rate {aging}, --max-wait-s {max_wait}) but not "
                "enough: raise --aging-rate or lower --max-wait-s"
            )
            findings.append(
                {
                    "trap": "starvation",
                    "policy": data.policy,
                    "run": data.run,
                    "title": f"Long class '{starvation['long_class']}' starved under {policy_name}",
                    "evidence": {
                        **starvation,
                        "fcfs_long_p99_queue_s": fcfs_long_p99,
                        "aging_rate": aging,
                        "max_wait_s": max_wait,
                    },
                    "worst_requests": _worst(long_rows, "queue_s", ("e2e_s",)),
                    "knob": knob,
                    "message": (
                        f"p99 queue wait of '{starvation['long_class']}' is {long_p99:.2f} s, "
                        f"{ratio:.1f}x that of '{starvation['short_class']}'"
                        + (
                            f" and {long_p99 / max(fcfs_long_p99, 1e-9):.1f}x FCFS's"
                            if fcfs_long_p99 is not None
                            else ""
                        )
                        + "."
                    ),
                }
            )

    # 4. memory pressure: KV pool full -> rejections or preemptions
    rejections = (facts.get("rejections_by_reason") or {}).get("exceeds_kv_pool", 0)
    oob = facts.get("out_of_blocks_preemptions") or 0
    if rejections > 0 or (frame.height and oob >= max(1.0, PREEMPT_SHARE * frame.height)):
        rejected = frame.filter(
            (pl.col("status") == "rejected") & (pl.col("error") == "exceeds_kv_pool")
        )
        worst = (
            [
                {"request_id": r, "class": c, "prompt_tokens": p, "max_tokens": m}
                for r, c, p, m in rejected.select(
                    "request_id", "class", "prompt_tokens", "max_tokens"
                )
                .head(WORST)
                .iter_rows()
            ]
            if rejected.height
            else _worst(frame, "preemptions", ("stall_s", "e2e_s"))
        )
        findings.append(
            {
                "trap": "memory_pressure",
                "policy": data.policy,
                "run": data.run,
                "title": "KV pool full: rejections and preemptions",
                "evidence": {
                    "exceeds_kv_pool_rejections": rejections,
                    "out_of_blocks_preemptions": oob,
                    "preemption_share": clean(oob / frame.height) if frame.height else None,
                    "waits_by_reason": facts.get("waits_by_reason"),
                    "max_kv_usage": facts.get("max_kv_usage"),
                    "num_device_blocks": facts.get("num_device_blocks"),
                    "block_size": cache.get("block_size"),
                },
                "worst_requests": worst,
                "knob": (
                    "more KV blocks: --gpu-memory-utilization (now "
                    f"{cache.get('gpu_memory_utilization')}) or --num-gpu-blocks-override "
                    f"(now {cache.get('num_gpu_blocks_override')}); fewer concurrent sequences: "
                    f"--max-num-seqs (now {sched.get('max_num_seqs')}); a --max-model-len the "
                    "pool can hold"
                ),
                "message": (
                    f"{rejections} requests could never fit the KV pool (rejected) and "
                    f"{oob} preemptions were forced by out-of-blocks."
                ),
            }
        )

    # 5. cache thrash: cached prefixes evicted before they were reused
    evicted = facts.get("evicted_prefix_tokens") or 0
    queried = facts.get("prefix_queried_tokens") or 0
    blocks = facts.get("evicted_blocks")
    lost = evicted / queried if queried else 0.0
    if (
        cache.get("enable_prefix_caching") is not False
        and evicted >= THRASH_MIN_TOKENS
        and lost >= THRASH_SHARE
        and (blocks is None or blocks > 0)
    ):
        findings.append(_cache_thrash(data, frame, facts, lost, rerun or {}))
    return findings


def _cache_thrash(
    data: PolicyData, frame: pl.DataFrame, facts: dict, lost: float, rerun: dict
) -> dict:
    """Trap 5's finding: the evidence, the knob and a command that simulates the fix."""
    sched = data.config.get("scheduler") or {}
    cache = data.config.get("cache") or {}
    evicted, queried = facts["evicted_prefix_tokens"], facts["prefix_queried_tokens"]
    cached = facts.get("prefix_cached_tokens") or 0
    pool = facts.get("num_device_blocks") or cache.get("num_gpu_blocks_override")
    halves = load_halves(data, frame)
    blocks = facts.get("evicted_blocks")
    evidence = {
        "evicted_prefix_tokens": evicted,
        "prefix_queried_tokens": queried,
        "evicted_prefix_share": clean(lost),
        "prefix_cached_tokens": cached,
        "hit_rate": clean(cached / queried) if queried else None,
        "evicted_blocks": blocks,
        "num_device_blocks": facts.get("num_device_blocks"),
        "max_kv_usage": facts.get("max_kv_usage"),
        "block_size": cache.get("block_size"),
        "max_num_seqs": sched.get("max_num_seqs"),
        "gpu_memory_utilization": cache.get("gpu_memory_utilization"),
        "num_gpu_blocks_override": cache.get("num_gpu_blocks_override"),
    }
    said = "" if blocks is None else f" ({blocks:,} blocks evicted over the run)"
    if halves is not None:
        evidence.update(
            load_split_by=halves["by"],
            hit_rate_light_load=halves["light"]["hit_rate"],
            hit_rate_heavy_load=halves["heavy"]["hit_rate"],
            mean_running_light_load=halves["light"]["mean_running"],
            mean_running_heavy_load=halves["heavy"]["mean_running"],
        )
        light, heavy = halves["light"]["hit_rate"], halves["heavy"]["hit_rate"]
        if light is not None and heavy is not None:
            said += (
                f". Hit rate {light:.0%} over the half of the requests admitted at the "
                f"lighter load, {heavy:.0%} over the heavier half (by {halves['by']})"
            )
    said += "."
    policy = sched.get("scheduling_policy") or data.identity.policy or data.policy
    changes: dict = {}
    if pool:
        changes["num_gpu_blocks_override"] = int(pool) * THRASH_POOL_FACTOR
    elif sched.get("max_num_seqs"):
        changes["max_num_seqs"] = max(1, int(sched["max_num_seqs"]) // THRASH_POOL_FACTOR)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{data.run}-{data.policy}").strip("-.")
    out = f"runs/{slug or 'cache'}-more-kv"
    return {
        "trap": "cache_thrash",
        "policy": data.policy,
        "run": data.run,
        "title": "Prefix cache thrash: cached prefixes evicted before their reuse",
        "evidence": evidence,
        "worst_requests": _worst(
            frame, "evicted_prefix_tokens", ("cached_tokens", "prompt_tokens", "ttft_s")
        ),
        "knob": (
            "more KV blocks: --num-gpu-blocks-override (now "
            f"{cache.get('num_gpu_blocks_override')}; the pool had {pool} blocks) or "
            f"--gpu-memory-utilization (now {cache.get('gpu_memory_utilization')}); fewer "
            f"concurrent sequences: --max-num-seqs (now {sched.get('max_num_seqs')}), so "
            "running requests hold fewer blocks and more prefixes stay cached"
        ),
        "command": simulate_command(data.config, policy, rerun, changes, out),
        "message": (
            f"{evicted:,} prompt tokens ({lost:.0%} of the {queried:,} the first admissions asked "
            "the prefix cache for) had been cached and were evicted before they were "
            f"reused: hits lost for want of room{said}"
        ),
    }


#: Run info a rerun command reads, with the types a recorded value must have.
RERUN_KEYS: dict[str, tuple[type, ...]] = {
    "profile": (str,),
    "seed": (int,),
    "rate_scale": (int, float),
    "duration_scale": (int, float),
}


def rerun_info(*sources: object) -> dict:
    """The profile, seed, rate and duration scales a rerun of a cell needs, from the
    first of ``sources`` (a cell's run.json, then its run's summary.json or run.json)
    that recorded each with the right type."""
    out: dict = {}
    for source in sources:
        for key, kinds in RERUN_KEYS.items():
            value = source.get(key) if isinstance(source, dict) else None
            if key not in out and isinstance(value, kinds) and not isinstance(value, bool):
                out[key] = value
    return out


def simulate_command(config: dict, policy: str, rerun: dict, changes: dict, out: str) -> str:
    """The ``schedscope simulate`` command line of the cell's profile (``PROFILE`` when
    not recorded), seed, rate and duration scales, ``policy`` and engine knobs (its
    ``config``, the knobs that differ from the defaults), with ``changes`` (knob ->
    value) applied; records into ``out``."""
    from harness.serve.knobs import KNOB_SECTIONS, knob_flags, knob_types

    names = knob_types()
    values: dict = {}
    for section, _ in KNOB_SECTIONS:
        part = config.get(section)
        if isinstance(part, dict):
            values.update({k: v for k, v in part.items() if k in names})
    if isinstance(config.get("model"), str):
        values["model"] = config["model"]
    values.update(changes)
    values.pop("scheduling_policy", None)
    args = ["schedscope", "simulate", "--profile", str(rerun.get("profile") or "PROFILE")]
    args += ["--policy", policy]
    if rerun.get("seed") is not None:
        args += ["--seed", str(rerun["seed"])]
    for key in ("rate_scale", "duration_scale"):
        if rerun.get(key) not in (None, 1):
            args += [f"--{key.replace('_', '-')}", f"{rerun[key]:g}"]
    return shlex.join([*args, *knob_flags(values), "--out", out])


def load_halves(data: PolicyData, frame: pl.DataFrame) -> dict | None:
    """The prefix-cache hit rate of the admitted requests
    (:func:`harness.report.prefix_cache.admitted_known` with a first admission time)
    split in two halves by how loaded the engine was when it first admitted them: the
    running sequences of the step that admitted them (``first_scheduled_at`` as-of
    joined onto steps.parquet's ``schedule_start``), else their order of admission.
    None with fewer than two such requests."""
    rows = (
        prefix_cache.admitted_known(frame)
        .filter(pl.col("first_scheduled_at").is_not_null())
        .sort("first_scheduled_at", "request_id")
    )
    if rows.height < 2:
        return None
    if data.steps is not None and {"schedule_start", "num_running"} <= set(data.columns("steps")):
        steps = (
            data.steps.select(
                pl.col("schedule_start").cast(pl.Float64), pl.col("num_running").cast(pl.Int64)
            )
            .drop_nulls()
            .sort("schedule_start")
            .collect()
        )
        rows = rows.join_asof(
            steps, left_on="first_scheduled_at", right_on="schedule_start", strategy="backward"
        )
        by = "running sequences at the first admission"
        rows = rows.with_row_index("order").sort("num_running", "order", nulls_last=False)
    else:
        by = "order of first admission"
        rows = rows.with_columns(pl.lit(None, pl.Int64).alias("num_running"))
    half = rows.height // 2

    def side(part: pl.DataFrame) -> dict:
        prompt = int(part["prompt_tokens"].sum())
        return {
            "requests": part.height,
            "hit_rate": clean(int(part["cached_tokens"].sum()) / prompt) if prompt else None,
            "mean_running": clean(part["num_running"].mean()),
        }

    return {"by": by, "light": side(rows.head(half)), "heavy": side(rows.tail(rows.height - half))}
