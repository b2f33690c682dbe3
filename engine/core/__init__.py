"""The engine's core: per-request state and the bookkeeping the scheduler works on.

Requests and sequences, the decisions the scheduler records, the engine clock, KV block
pools and their sizing, the cost model the scheduler prices preemption with, and the
executor interface a step is handed to. Pure Python: nothing here imports torch,
aiohttp or OpenTelemetry (a contract in ``pyproject.toml`` checks it). The scheduler
itself is in ``engine.core.sched``.
"""
