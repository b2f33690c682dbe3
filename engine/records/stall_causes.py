"""Stall causes: the one list of names a stall is attributed to.

A stall is an inter-token gap at or above the run's stall threshold (never below
``engine.core.token_timing.STALL_FLOOR_S``; docs/metrics.md, "Stalls"). Each stall is
attributed to exactly one cause, from what the engine did to the request over that gap:
the first that applies in this order (docs/metrics.md's precedence, kept by
:data:`STALL_CAUSES`):

- :data:`SWAPPED_OUT` — the request was swapped out (a swap preemption or a
  ``swap_out`` decision) inside the gap.
- :data:`RECOMPUTE` — it was preempted by recompute and re-prefilled (its KV dropped and
  computed again) inside the gap.
- :data:`PREEMPTED_WAITING` — it was preempted and neither swapped out nor re-prefilled
  yet: it waited to be scheduled again.
- :data:`PREFILL_INTERFERENCE` — it was in a step where other requests' prefill tokens
  were at least half the step's batched tokens (prefill tokens plus decode sequences).
- :data:`TOKEN_BUDGET` — an ``idle_running`` decision listed it: running, but left out
  of a step by the token budget.
- :data:`OTHER` — none of these.

The engine's live metrics (``engine.telemetry``, ``schedscope_stalls_total{cause}``) and
the offline report (``harness.report``) both attribute stalls with these names.
"""

from __future__ import annotations

SWAPPED_OUT = "swapped_out"
RECOMPUTE = "recompute"
PREEMPTED_WAITING = "preempted_waiting"
PREFILL_INTERFERENCE = "prefill_interference"
TOKEN_BUDGET = "token_budget"
OTHER = "other"

#: Every cause, in precedence order (the first that applies wins).
STALL_CAUSES = (
    SWAPPED_OUT,
    RECOMPUTE,
    PREEMPTED_WAITING,
    PREFILL_INTERFERENCE,
    TOKEN_BUDGET,
    OTHER,
)
