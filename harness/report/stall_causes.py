"""The causes the report attributes stalls to: the engine's (engine/records/stall_causes.py,
the names of its live ``schedscope_stalls_total{cause}``), then the one the report adds
for an external target, whose engine nobody here can see.

``external_unknown`` is the report's, not the engine's: the bundled engine always knows
what it did to a request, so its live metric never has this label; only a stall measured
by the client of an external engine (harness/run/client_stalls.py) gets it.
"""

from __future__ import annotations

from engine.records.stall_causes import STALL_CAUSES as ENGINE_STALL_CAUSES

#: A stall the client of an external engine saw; what the engine did is not known.
EXTERNAL_UNKNOWN = "external_unknown"
#: Every cause the report names, in precedence order (the engine's first).
STALL_CAUSES = (*ENGINE_STALL_CAUSES, EXTERNAL_UNKNOWN)
#: How the tables name a cause (the data keep the machine name).
CAUSE_LABELS = {c: c for c in ENGINE_STALL_CAUSES} | {EXTERNAL_UNKNOWN: "unknown: external engine"}

#: A cell's run.json ``stall_source``: where its requests' ``stalls`` came from.
ENGINE_RECORDS = "engine records"
CLIENT_TOKEN_TIMES = "client token times (first_token_at + itl_s)"
