"""Grafana dashboards built as code (grafana-foundation-sdk, Grafana 11.6 build).

Two dashboards, written as JSON under ``dashboards/`` by ``schedscope dashboards build``:

- ``schedscope-scheduler``: queue depth, KV usage, the prefix cache (hit rate, tokens by
  source, evictions, hit rate by conversation turn), preemptions, decisions, idle-running
  sequences (trap 1), batch tokens against the token budget.
- ``schedscope-stalls-latency``: stalls by cause, TTFT/ITL/TPOT/E2E quantiles with
  exemplars, queue time by class (trap 3), recomputed tokens (trap 2), swap bandwidth,
  dropped spans.

Both work against either generation of vLLM's metric names (docs/dashboards.md): where V0
and V1 differ, a panel queries both with PromQL ``or`` and its description names the
engines that fill it. Quantile panels join the generations *after* ``histogram_quantile``
(never bucket series), so two bucket layouts are never mixed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dashmodel
from grafana_foundation_sdk.models import prometheus as prommodel

#: The Grafana build the SDK is pinned to (pyproject.toml: grafana_foundation_sdk ...!11.6.0).
GRAFANA_TARGET = "11.6"

SCHEDULER_UID = "schedscope-scheduler"
STALLS_LATENCY_UID = "schedscope-stalls-latency"

#: Every dashboard variable a query may carry, with the value a query check substitutes
#: by default: the regex that matches every label value, and Grafana's rate window.
DEFAULT_SUBSTITUTIONS: Mapping[str, str] = {
    "model_name": ".*",
    "instance": ".*",
    "__rate_interval": "1m",
}

_DATASOURCE = dashmodel.DataSourceRef(type_val="prometheus", uid="${datasource}")
_SEL = 'model_name=~"$model_name", instance=~"$instance"'
_QUANTILES = (0.5, 0.9, 0.99)


# -- PromQL helpers -------------------------------------------------------------------------


def _sel(metric: str, extra: str = "") -> str:
    return f"{metric}{{{_SEL}{', ' + extra if extra else ''}}}"


def _gauge(metric: str, by: str = "model_name") -> str:
    return f"sum by ({by}) ({_sel(metric)})"


_BY_TURN = "model_name, turn"


def _rate(metric: str, by: str = "model_name") -> str:
    return f"sum by ({by}) (rate({_sel(metric)}[$__rate_interval]))"


def _quantile(q: float, histogram: str, by: str = "model_name") -> str:
    return (
        f"histogram_quantile({q}, sum by (le, {by}) "
        f"(rate({_sel(histogram + '_bucket')}[$__rate_interval])))"
    )


def _mean(histogram: str, by: str = "model_name") -> str:
    return f"{_rate(histogram + '_sum', by)} / {_rate(histogram + '_count', by)}"


def _either(v1: str, v0: str) -> str:
    """V1's series where they exist, else V0's (label sets match, so no duplicates)."""
    return f"({v1}) or ({v0})"


# -- panel specs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str
    exemplar: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "table" (instant query, labels as columns)
    overrides: Mapping[str, str] = field(default_factory=dict)  # refId -> unit


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def _quantile_targets(v1: str, v0: str | None = None, by: str = "model_name") -> tuple[Target, ...]:
    targets = []
    for q in _QUANTILES:
        expr = _quantile(q, v1, by)
        if v0 is not None:
            expr = _either(expr, _quantile(q, v0, by))
        legend = f"p{round(q * 100)} " + " ".join(
            f"{{{{{label.strip()}}}}}" for label in by.split(",")
        )
        targets.append(Target(expr, legend, exemplar=True))
    return tuple(targets)


_BOTH = "Engines: schedscope, vLLM V0 and vLLM V1 (a name both generations share)."
#: Appended to the description of every panel with an exemplar target: vLLM's histograms
#: carry no exemplars, so only schedscope's dots link to traces.
EXEMPLARS_NOTE = (
    "Trace links (exemplar dots) are schedscope-only: vLLM exposes no exemplars, so a real "
    "vLLM fills this panel's series but not its exemplar dots."
)


def panel_description(panel: Panel) -> str:
    """The panel's description as the dashboard shows it: with :data:`EXEMPLARS_NOTE`
    when any of its targets asks for exemplars."""
    if any(target.exemplar for target in panel.targets):
        return f"{panel.description} {EXEMPLARS_NOTE}"
    return panel.description


SCHEDULER_ROWS: tuple[Row, ...] = (
    Row(
        "Queues",
        (
            Panel(
                "Queue depth: running, waiting, swapped",
                "Requests running (admitted, holding KV blocks), waiting to be admitted, and "
                "swapped out to host memory. Engines: running and waiting from schedscope, vLLM V0 "
                "and V1; swapped from schedscope and vLLM V0 only (vllm:num_requests_swapped; V1 "
                "is recompute-only and has no swapped queue, so that line is empty there). "
                "Healthy: waiting returns to zero between bursts and running stays near the batch "
                "you sized. Unhealthy: waiting grows without bound (arrivals exceed capacity: "
                "raise --max-num-seqs or --gpu-memory-utilization, or shed load), or swapped stays "
                "above zero (KV pool too small for the batch: lower --max-num-seqs or raise "
                "--gpu-memory-utilization).",
                (
                    Target(_gauge("vllm:num_requests_running"), "running {{model_name}}"),
                    Target(_gauge("vllm:num_requests_waiting"), "waiting {{model_name}}"),
                    Target(_gauge("vllm:num_requests_swapped"), "swapped {{model_name}}"),
                ),
            ),
            Panel(
                "Waiting requests by reason",
                "Why waiting requests are not admitted (vllm:num_requests_waiting_by_reason: V1's "
                "reasons capacity and deferred, plus schedscope's own). Engines: schedscope and "
                "vLLM V1 only; vLLM V0 has no such metric and shows no data here. "
                "Healthy: mostly empty, short spikes of capacity during bursts. Unhealthy: a "
                "standing capacity backlog means the KV pool or seat count is the limit (raise "
                "--gpu-memory-utilization or --max-num-seqs); a deferred backlog under priority or "
                "SJF means the policy is holding requests back (--scheduling-policy, --aging-rate, "
                "--max-wait-s).",
                (
                    Target(
                        _gauge("vllm:num_requests_waiting_by_reason", "model_name, reason"),
                        "{{reason}} {{model_name}}",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "KV cache",
        (
            Panel(
                "KV cache usage: device and host",
                "Fraction of KV blocks in use. Engines: device from vllm:kv_cache_usage_perc (vLLM "
                "V1, schedscope) or vllm:gpu_cache_usage_perc (vLLM V0), whichever the engine has; "
                "host from vllm:cpu_cache_usage_perc, filled by schedscope and vLLM V0 only (V1 "
                "has no host swap pool). Healthy: device usage high but below 1 with headroom for "
                "decode growth; host near 0. Unhealthy: device pinned at 1 while preemptions rise "
                "(pool too small: raise --gpu-memory-utilization or lower --max-num-seqs); host "
                "usage at 1 means swaps will fall back to recompute (raise --swap-space).",
                (
                    Target(
                        _either(
                            _gauge("vllm:kv_cache_usage_perc"), _gauge("vllm:gpu_cache_usage_perc")
                        ),
                        "device {{model_name}}",
                    ),
                    Target(_gauge("vllm:cpu_cache_usage_perc"), "host {{model_name}}"),
                ),
                unit="percentunit",
            ),
            Panel(
                "KV blocks free / total by pool",
                "schedscope's block pools: free and total blocks, device and host. Engines: "
                "schedscope only. Healthy: device free blocks dip under load and recover; host "
                "total is large enough that swap-outs fit. Unhealthy: device free at 0 for long "
                "stretches (raise --gpu-memory-utilization, lower --max-num-seqs); host total "
                "small or host free at 0 during preemptions (raise --swap-space).",
                (
                    Target(
                        _gauge("schedscope_kv_blocks_free", "model_name, pool"), "free {{pool}}"
                    ),
                    Target(
                        _gauge("schedscope_kv_blocks_capacity", "model_name, pool"),
                        "total {{pool}}",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "Prefix cache",
        (
            Panel(
                "Prefix cache hit rate",
                "Share of prompt tokens found in the prefix cache instead of computed, over the "
                "rate interval: vllm:prompt_tokens_cached_total over vllm:prompt_tokens_total "
                "(each request's prompt counted once, when it is admitted: a request that waits "
                "is not counted again, as vLLM V1's query counters would), and vLLM's own "
                "vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total (recomputes' "
                "re-admissions included). Engines: schedscope and vLLM V1 (prefix caching is on "
                "by default in both; vLLM V0 exposes vllm:gpu_prefix_cache_hit_rate instead). "
                "Healthy: steady at the share of your traffic that repeats a prefix (a shared "
                "system prompt, earlier turns). Unhealthy: falling as load rises while evictions "
                "climb (cache thrash, docs/traps.md: the KV pool is too small for the working set "
                "of prefixes: raise --gpu-memory-utilization or lower --max-num-seqs); zero on "
                "traffic you know repeats prefixes (caching off, or prompts differ in their first "
                "block, e.g. a timestamp at the start of the system prompt).",
                (
                    Target(
                        f"{_rate('vllm:prompt_tokens_cached_total')} / "
                        f"{_rate('vllm:prompt_tokens_total')}",
                        "cached prompt tokens {{model_name}}",
                    ),
                    Target(
                        f"{_rate('vllm:prefix_cache_hits_total')} / "
                        f"{_rate('vllm:prefix_cache_queries_total')}",
                        "hits / queries {{model_name}}",
                    ),
                ),
                unit="percentunit",
            ),
            Panel(
                "Prompt tokens by source, and cached blocks evicted",
                "Prompt tokens per second computed (local_compute) and taken from the prefix cache "
                "(local_cache_hit), from vllm:prompt_tokens_by_source_total; and schedscope's "
                "cached KV blocks evicted per second, with the prompt tokens recomputed because "
                "their cached blocks had been evicted (hits lost for want of room). Engines: the "
                "sources from schedscope and vLLM V1; the evictions from schedscope only. Healthy: "
                "the cache_hit share steady; evictions without evicted-prefix tokens (the pool "
                "recycles blocks nobody reuses). Unhealthy: evicted-prefix tokens rising with "
                "load (cache thrash: more KV blocks with --gpu-memory-utilization, or fewer "
                "concurrent sequences with --max-num-seqs).",
                (
                    Target(
                        _rate("vllm:prompt_tokens_by_source_total", "model_name, source"),
                        "{{source}} {{model_name}}",
                    ),
                    Target(
                        _rate("schedscope_prefix_cache_evicted_blocks_total"),
                        "evicted blocks {{model_name}}",
                    ),
                    Target(
                        _rate("schedscope_prefix_cache_evicted_prefix_tokens_total"),
                        "evicted-prefix tokens {{model_name}}",
                    ),
                ),
            ),
            Panel(
                "Prompt per request: sent and computed",
                "Mean prompt tokens per request as sent (vllm:request_prompt_tokens) and as "
                "computed in its prefill, the cached prefix excluded "
                "(vllm:request_prefill_kv_computed_tokens). Sessions and agents re-send the "
                "whole conversation every turn, so the prompt sent grows turn after turn while "
                "what is computed stays the new message: the gap between the two lines is the "
                "prefix cache's work. Engines: schedscope and vLLM V1. Healthy: a wide gap on "
                "multi-turn or shared-prefix traffic. Unhealthy: the lines meet on such traffic "
                "(cached conversations evicted between turns: think times longer than the "
                "pool holds them, cache thrash, docs/traps.md: more KV blocks with "
                "--gpu-memory-utilization, or fewer concurrent sequences with --max-num-seqs; "
                "or --no-enable-prefix-caching set; or prompts that differ early).",
                (
                    Target(_mean("vllm:request_prompt_tokens"), "sent {{model_name}}"),
                    Target(
                        _mean("vllm:request_prefill_kv_computed_tokens"),
                        "computed {{model_name}}",
                    ),
                ),
            ),
            Panel(
                "Prefix cache hit rate by conversation turn",
                "Share of each turn's prompt tokens found in the prefix cache at its first "
                "admission: schedscope_prefix_cache_hits_by_turn_total over "
                "schedscope_prefix_cache_queries_by_turn_total, by turn (the client's "
                "X-Session-Turn header, which schedscope's load generator sends on session "
                "turns, else a chat request's count of user messages; turns 5 and later "
                "together; 'unknown': a completion that said no turn). Engines: schedscope only "
                "(vLLM counts no turns). Healthy: turn 1 at the share of its shared system "
                "prompt, later turns near their conversation's share of the prompt (everything "
                "but the new message). Unhealthy: later turns no better than turn 1 (the "
                "conversation was evicted during the think time: cache thrash, docs/traps.md: "
                "more KV blocks with --gpu-memory-utilization, or fewer concurrent sequences "
                "with --max-num-seqs; or prompts that differ between turns, e.g. a rewritten "
                "history).",
                (
                    Target(
                        f"{_rate('schedscope_prefix_cache_hits_by_turn_total', _BY_TURN)} / "
                        f"{_rate('schedscope_prefix_cache_queries_by_turn_total', _BY_TURN)}",
                        "turn {{turn}} {{model_name}}",
                    ),
                ),
                unit="percentunit",
            ),
        ),
    ),
    Row(
        "Preemptions and decisions",
        (
            Panel(
                "Preemptions per second by mode",
                "Preemptions by mode (swap or recompute) and reason, swap fallbacks (a swap "
                "preemption that found no host room and recomputed instead: trap 2), and vLLM's "
                "total. Engines: by mode and fallbacks from schedscope only; the total "
                "(vllm:num_preemptions_total) from schedscope, vLLM V0 and V1. Healthy: zero or "
                "rare, short spikes. Unhealthy: a steady rate means the KV pool cannot hold the "
                "batch (lower --max-num-seqs, raise --gpu-memory-utilization); swap fallbacks mean "
                "--swap-space is too small (raise it, or choose --preemption-mode recompute "
                "deliberately).",
                (
                    Target(_rate("schedscope_preemptions_total", "model_name, mode"), "{{mode}}"),
                    Target(
                        _rate("schedscope_swap_fallbacks_total", "model_name, reason"),
                        "swap fallback: {{reason}}",
                    ),
                    Target(_rate("vllm:num_preemptions_total"), "all (vllm) {{model_name}}"),
                ),
                unit="ops",
            ),
            Panel(
                "Scheduler decisions per second by kind",
                "Every decision the scheduler took, by kind (admit, preempt, swap-out, swap-in, "
                "recompute, reject, ...). Engines: schedscope only. Healthy: admits track the "
                "arrival rate; preempt, swap and reject near zero. Unhealthy: rejects mean the "
                "queue cap or the model length refuses requests (--max-waiting, --max-model-len); "
                "preempt and swap churn means the batch outgrows the KV pool (--max-num-seqs, "
                "--gpu-memory-utilization, --swap-space).",
                (Target(_rate("schedscope_decisions_total", "model_name, kind"), "{{kind}}"),),
                unit="ops",
            ),
            Panel(
                "Scheduler decisions per second by reason",
                "The same decisions split by kind and reason: why a request waited, was preempted "
                "or was rejected when the KV pool was full (trap 4). Engines: schedscope only. "
                "Healthy: few non-admit reasons. Unhealthy: one reason dominating names the knob: "
                "no free blocks (--gpu-memory-utilization, --max-num-seqs), token budget "
                "(--max-num-batched-tokens), no host room (--swap-space).",
                (
                    Target(
                        _rate("schedscope_decisions_total", "model_name, kind, reason"),
                        "{{kind}}: {{reason}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Scheduler configuration",
                "The knobs the engine runs with (schedscope_scheduler_config_info labels: policy, "
                "preemption mode, ...). Engines: schedscope only. Healthy: one row per instance, "
                "the values you meant to deploy. Unhealthy: instances disagreeing, or a policy or "
                "preemption mode you did not intend (--scheduling-policy, --preemption-mode).",
                (
                    Target(
                        _gauge(
                            "schedscope_scheduler_config_info",
                            "model_name, instance, policy, preemption_mode",
                        ),
                        "{{policy}}",
                    ),
                ),
                kind="table",
            ),
        ),
    ),
    Row(
        "Batching and token budget",
        (
            Panel(
                "Idle-running sequences vs running",
                "Trap 1: sequences admitted (running, holding KV blocks) that the token budget "
                "left out of the step, against all running sequences; and idle sequence-steps per "
                "second. Engines: idle from schedscope only; running from schedscope, vLLM V0 and "
                "V1. Healthy: idle near 0, every running sequence is in every step. Unhealthy: "
                "idle a large share of running, typically after raising --max-num-seqs without "
                "--max-num-batched-tokens: raise --max-num-batched-tokens or lower --max-num-seqs.",
                (
                    Target(
                        _gauge("schedscope_idle_running_sequences"), "idle running {{model_name}}"
                    ),
                    Target(_gauge("vllm:num_requests_running"), "running {{model_name}}"),
                    Target(
                        _rate("schedscope_idle_running_sequence_steps_total"),
                        "idle sequence-steps/s {{model_name}}",
                    ),
                ),
            ),
            Panel(
                "Batch tokens per step vs max_num_batched_tokens",
                "Tokens scheduled per engine step (p50, p99) against the token budget. Engines: "
                "quantiles from vllm:iteration_tokens_total (schedscope, vLLM V0 and V1) or, where "
                "absent, schedscope_batch_tokens; the budget line (schedscope_token_budget_tokens) "
                "from schedscope only. Healthy: p99 reaches the budget under load (steps are full) "
                "and p50 well below it when load is light. Unhealthy: p99 flat at the budget while "
                "waiting or idle-running grows (raise --max-num-batched-tokens); steps far below "
                "the budget with a full queue (the seat count limits: raise --max-num-seqs).",
                (
                    Target(
                        _either(
                            _quantile(0.5, "vllm:iteration_tokens_total"),
                            _quantile(0.5, "schedscope_batch_tokens"),
                        ),
                        "p50 {{model_name}}",
                    ),
                    Target(
                        _either(
                            _quantile(0.99, "vllm:iteration_tokens_total"),
                            _quantile(0.99, "schedscope_batch_tokens"),
                        ),
                        "p99 {{model_name}}",
                    ),
                    Target(_gauge("schedscope_token_budget_tokens"), "budget {{model_name}}"),
                ),
            ),
            Panel(
                "Step duration",
                "Wall time of one engine step (schedule, execute, postprocess), p50/p90/p99. "
                "Engines: schedscope only. Healthy: steady, rising gently with batch size. "
                "Unhealthy: p99 far above p50 means some steps carry long prefills that stall "
                "every decode in them (lower --max-num-batched-tokens to chunk prefills finer).",
                _quantile_targets("schedscope_step_duration_seconds"),
                unit="s",
            ),
            Panel(
                "Token throughput and finished requests",
                "Prompt and generation tokens per second and requests finished per second by "
                "reason. "
                + _BOTH
                + " Healthy: generation tokens/s flat under steady load, finishes mostly stop "
                "or length. Unhealthy: throughput falling while waiting grows (preemption or "
                "recompute churn: --max-num-seqs, --swap-space), or abort/error finishes.",
                (
                    Target(_rate("vllm:prompt_tokens_total"), "prompt tokens/s {{model_name}}"),
                    Target(
                        _rate("vllm:generation_tokens_total"), "generation tokens/s {{model_name}}"
                    ),
                    Target(
                        _rate("vllm:request_success_total", "model_name, finished_reason"),
                        "finished/s {{finished_reason}}",
                    ),
                ),
            ),
        ),
    ),
)

STALLS_LATENCY_ROWS: tuple[Row, ...] = (
    Row(
        "Stalls",
        (
            Panel(
                "Stalls per second by cause",
                "Inter-token gaps longer than the stall threshold, attributed to one cause "
                "(swapped_out, recompute, preempted_waiting, prefill_interference, token_budget, "
                "other). Engines: schedscope only. Healthy: near zero. Unhealthy: recompute (raise "
                "--swap-space, or --preemption-mode swap), swapped_out or preempted_waiting (KV "
                "pool too small: --gpu-memory-utilization, --max-num-seqs), prefill_interference "
                "(lower --max-num-batched-tokens), token_budget (trap 1: raise "
                "--max-num-batched-tokens).",
                (Target(_rate("schedscope_stalls_total", "model_name, cause"), "{{cause}}"),),
                unit="ops",
            ),
            Panel(
                "Stall time by cause",
                "Seconds of stall per second (sum of schedscope_stall_duration_seconds) by cause, "
                "and p99 stall length with exemplars that link to the stalled request's trace. "
                "Engines: schedscope only. Healthy: a small fraction of a second per second. "
                "Unhealthy: multi-second recompute stalls are trap 2 (raise --swap-space); long "
                "preempted_waiting stalls mean the pool is oversubscribed (--max-num-seqs, "
                "--gpu-memory-utilization).",
                (
                    Target(
                        _rate("schedscope_stall_duration_seconds_sum", "model_name, cause"),
                        "stall s/s {{cause}}",
                    ),
                    Target(
                        _quantile(0.99, "schedscope_stall_duration_seconds", "cause"),
                        "p99 {{cause}}",
                        exemplar=True,
                    ),
                ),
                unit="s",
            ),
        ),
    ),
    Row(
        "Latency",
        (
            Panel(
                "Time to first token",
                "TTFT quantiles (vllm:time_to_first_token_seconds); exemplar dots open the "
                "request's trace. "
                + _BOTH
                + " Healthy: p99 within your TTFT SLO and close to p50. Unhealthy: "
                "p99 climbing with queue depth (queueing: --max-num-seqs, "
                "--gpu-memory-utilization), or a long p99 under SJF/priority (starvation: "
                "--scheduling-policy, --aging-rate, --max-wait-s).",
                _quantile_targets("vllm:time_to_first_token_seconds"),
                unit="s",
            ),
            Panel(
                "Inter-token latency",
                "Gap between consecutive output tokens. Engines: vLLM V1 and schedscope "
                "(vllm:inter_token_latency_seconds) or vLLM V0 "
                "(vllm:time_per_output_token_seconds, which V0 observed per token). Healthy: p99 a "
                "small multiple of p50. Unhealthy: a p99 of seconds is a stall (see the stall "
                "panels): recompute (--swap-space, --preemption-mode) or long prefills in the "
                "same step (--max-num-batched-tokens).",
                _quantile_targets(
                    "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
                ),
                unit="s",
            ),
            Panel(
                "Time per output token (per request)",
                "Each request's mean decode time per token. Engines: vLLM V1 and schedscope "
                "(vllm:request_time_per_output_token_seconds) or vLLM V0 "
                "(vllm:time_per_output_token_seconds, the name V0's dashboard plots as TPOT). "
                "Healthy: flat under steady load. Unhealthy: rising with running requests (batch "
                "too large for the step time you need: lower --max-num-seqs) or with preemptions "
                "(--swap-space, --gpu-memory-utilization).",
                _quantile_targets(
                    "vllm:request_time_per_output_token_seconds",
                    "vllm:time_per_output_token_seconds",
                ),
                unit="s",
            ),
            Panel(
                "End-to-end request latency",
                "E2E quantiles (vllm:e2e_request_latency_seconds). "
                + _BOTH
                + " Healthy: tracks output length times TPOT plus TTFT. Unhealthy: a long tail "
                "beyond that is queueing or stalls: check queue time and the stall panels "
                "(--max-num-seqs, --swap-space, --scheduling-policy).",
                _quantile_targets("vllm:e2e_request_latency_seconds"),
                unit="s",
            ),
            Panel(
                "Request queue time",
                "Time from arrival to first scheduling (vllm:request_queue_time_seconds). "
                + _BOTH
                + " Healthy: near zero except during bursts. Unhealthy: p99 growing steadily "
                "(capacity: --max-num-seqs, --gpu-memory-utilization, --max-num-batched-tokens).",
                _quantile_targets("vllm:request_queue_time_seconds"),
                unit="s",
            ),
        ),
    ),
    Row(
        "Fairness",
        (
            Panel(
                "Queue time by request class",
                "Trap 3: p50/p90/p99 queue wait per request class (schedscope_queue_time_seconds). "
                "Engines: schedscope only. Healthy: long and short classes wait within a small "
                "factor of each other. Unhealthy: the long class's p99 far above the short class's "
                "under SJF or priority is starvation: set --aging-rate or --max-wait-s, or change "
                "--scheduling-policy to fcfs.",
                _quantile_targets("schedscope_queue_time_seconds", by="class"),
                unit="s",
            ),
        ),
    ),
    Row(
        "Preemption cost",
        (
            Panel(
                "Recomputed tokens per second",
                "Trap 2: tokens re-prefilled because a recompute preemption threw their KV away, "
                "against all prompt tokens prefilled. Engines: recomputed from schedscope only; "
                "prompt tokens from schedscope, vLLM V0 and V1. Healthy: zero or a sliver of "
                "prompt tokens. Unhealthy: a visible share of prefill work is recompute: raise "
                "--swap-space (swap fallbacks), use --preemption-mode swap, or lower "
                "--max-num-seqs.",
                (
                    Target(
                        _rate("schedscope_recomputed_tokens_total"), "recomputed {{model_name}}"
                    ),
                    Target(_rate("vllm:prompt_tokens_total"), "prompt {{model_name}}"),
                ),
            ),
            Panel(
                "Swap bandwidth",
                "Bytes per second copied device to host (out) and host to device (in), and blocks "
                "per second (right axis). Engines: schedscope only (vLLM V1 does not swap). "
                "Healthy: zero, or short bursts well under the copy bandwidth. Unhealthy: "
                "sustained swap traffic means the batch outgrows the pool (lower --max-num-seqs, "
                "raise --gpu-memory-utilization); swap-out without swap-in means host space is "
                "full (--swap-space).",
                (
                    Target(
                        _rate("schedscope_swap_bytes_total", "model_name, direction"),
                        "bytes/s {{direction}}",
                    ),
                    Target(
                        _rate("schedscope_swap_blocks_total", "model_name, direction"),
                        "blocks/s {{direction}}",
                    ),
                ),
                unit="Bps",
                overrides={"B": "short"},
            ),
            Panel(
                "Dropped spans",
                "Spans the tracer dropped (its export queue was full), per second. Engines: "
                "schedscope only. Healthy: zero, every request's stall attribution is complete. "
                "Unhealthy: above zero, per-request explanations have holes: trace less (sampling) "
                "or size the span queue for the load; if it drops under load spikes, lower "
                "--max-num-seqs for the run being traced.",
                (Target(_rate("schedscope_dropped_spans_total"), "dropped/s {{model_name}}"),),
                unit="ops",
            ),
        ),
    ),
)

DASHBOARDS: Mapping[str, tuple[str, str, tuple[Row, ...]]] = {
    SCHEDULER_UID: (
        "schedscope / Scheduler",
        "Queues, KV cache, preemptions, scheduler decisions and the token budget "
        "(schedscope and vLLM V0/V1).",
        SCHEDULER_ROWS,
    ),
    STALLS_LATENCY_UID: (
        "schedscope / Stalls & latency",
        "Stalls by cause, latency quantiles with trace exemplars, queue time by class, "
        "preemption cost (schedscope and vLLM V0/V1).",
        STALLS_LATENCY_ROWS,
    ),
}


# -- building -------------------------------------------------------------------------------


def _variables() -> list[Builder[dashmodel.VariableModel]]:
    def label_variable(name: str, label: str, query: str) -> dash.QueryVariable:
        return (
            dash.QueryVariable(name)
            .label(label)
            .datasource(_DATASOURCE)
            .query(query)
            .refresh(dashmodel.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dashmodel.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )

    return [
        dash.DatasourceVariable("datasource").label("Datasource").type("prometheus"),
        label_variable(
            "model_name", "Model", "label_values(vllm:num_requests_running, model_name)"
        ),
        label_variable(
            "instance",
            "Instance",
            'label_values(vllm:num_requests_running{model_name=~"$model_name"}, instance)',
        ),
    ]


def _panel_builder(panel: Panel, panel_id: int):
    builder: table.Panel | timeseries.Panel
    if panel.kind == "table":
        builder = (
            table.Panel()
            .id(panel_id)
            .span(24)
            .height(5)
            .align(common.FieldTextAlignment.AUTO)
            .inspect(False)
            .show_header(True)
            .with_transformation(
                dashmodel.DataTransformerConfig(
                    id_val="labelsToFields", options={"mode": "columns"}
                )
            )
        )
    else:
        builder = (
            timeseries.Panel()
            .id(panel_id)
            .span(12)
            .height(8)
            .line_width(1)
            .fill_opacity(10)
            .show_points(common.VisibilityMode.NEVER)
            .legend(_legend())
            .tooltip(
                common_builders.VizTooltipOptions()
                .mode(common.TooltipDisplayMode.MULTI)
                .sort(common.SortOrder.DESCENDING)
            )
        )
    builder = (
        builder.title(panel.title)
        .description(panel_description(panel))
        .datasource(_DATASOURCE)
        .unit(panel.unit)
    )
    for index, target in enumerate(panel.targets):
        query = (
            prometheus.Dataquery()
            .ref_id(chr(ord("A") + index))
            .expr(target.expr)
            .legend_format(target.legend)
            .datasource(_DATASOURCE)
        )
        if panel.kind == "table":
            query = query.instant().format(prommodel.PromQueryFormat.TABLE)
        else:
            query = query.range()
        if target.exemplar:
            query = query.exemplar(True)
        builder = builder.with_target(query)
    for ref_id, unit in panel.overrides.items():
        builder = builder.override_by_query(
            ref_id,
            [
                dashmodel.DynamicConfigValue(id_val="unit", value=unit),
                dashmodel.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ],
        )
    return builder


def _legend() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs(["mean", "max"])
    )


def build_dashboard(uid: str) -> dashmodel.Dashboard:
    """The SDK model of one dashboard (``uid`` from :data:`DASHBOARDS`)."""
    title, description, rows = DASHBOARDS[uid]
    builder = (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["schedscope", "vllm", "scheduler"])
        .editable()
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .tooltip(dashmodel.DashboardCursorSync.CROSSHAIR)
        .variables(_variables())
        .link(
            dash.DashboardLink("schedscope dashboards")
            .type(dashmodel.DashboardLinkType.DASHBOARDS)
            .tags(["schedscope"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    panel_id = 1
    for row in rows:
        builder = builder.with_row(dash.Row(row.title).id(panel_id))
        panel_id += 1
        for panel in row.panels:
            builder = builder.with_panel(_panel_builder(panel, panel_id))
            panel_id += 1
    return builder.build()


def dashboard_dict(uid: str) -> dict:
    """One dashboard as Grafana's JSON model (a plain dict)."""
    return json.loads(json.dumps(build_dashboard(uid), cls=JSONEncoder))


def dashboard_text(uid: str) -> str:
    """The exact text written to ``dashboards/<uid>.json`` (sorted keys, stable)."""
    return json.dumps(dashboard_dict(uid), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def dashboard_filename(uid: str) -> str:
    return f"{uid}.json"


def write_dashboards(out_dir: Path) -> list[Path]:
    """Write every dashboard's JSON into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for uid in DASHBOARDS:
        path = out_dir / dashboard_filename(uid)
        path.write_text(dashboard_text(uid), encoding="utf-8")
        paths.append(path)
    return paths


# -- the queries, for checks against a real Prometheus ---------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    dashboard_uid: str
    panel_title: str
    ref_id: str
    expr: str
    exemplar: bool


_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def substitute(expr: str, substitutions: Mapping[str, str]) -> str:
    """Replace ``$name`` and ``${name}`` in ``expr``; a variable not in ``substitutions``
    raises KeyError (so no query with a ``$`` in it ever reaches Prometheus)."""

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in substitutions:
            raise KeyError(f"no substitution for dashboard variable ${name} in {expr!r}")
        return substitutions[name]

    return _VARIABLE.sub(replace, expr)


def panel_queries(
    substitutions: Mapping[str, str] | None = None, *, raw: bool = False
) -> list[PanelQuery]:
    """Every PromQL expression every panel of every dashboard runs, in panel order.

    Contract (relied on by the proof test that runs each query against a real Prometheus):

    - Read from the generated JSON model (what Grafana would run), one :class:`PanelQuery`
      per target: ``dashboard_uid``, ``panel_title``, ``ref_id``, ``expr``, ``exemplar``.
    - Variables are substituted: ``substitutions`` maps a variable name without ``$``
      (``model_name``, ``instance``, ``__rate_interval``) to its text, merged over
      :data:`DEFAULT_SUBSTITUTIONS` (``.*`` for the label regexes, ``1m`` for the rate
      window). Values go inside ``=~"..."`` matchers as they are: pass ``re.escape(name)``
      for a concrete model name with regex characters.
    - A variable with no substitution raises ``KeyError``; ``raw=True`` returns the
      expressions untouched (with ``$model_name`` and friends).
    - Every query is a range query in Grafana except the configuration table's (instant);
      both evaluate as instant queries too.
    """
    values = {**DEFAULT_SUBSTITUTIONS, **(substitutions or {})}
    queries = []
    for uid in DASHBOARDS:
        for panel in dashboard_dict(uid)["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"] if raw else substitute(target["expr"], values)
                queries.append(
                    PanelQuery(
                        uid,
                        panel["title"],
                        target["refId"],
                        expr,
                        bool(target.get("exemplar", False)),
                    )
                )
    return queries
