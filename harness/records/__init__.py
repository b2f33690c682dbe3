"""What a run writes: requests (``requests``), steps (``steps``), decisions
(``decision_log``), spans (``spans``), files written as the engine runs
(``incremental``), ``summary.json`` (``summary``) with its per-request statistics
(``request_stats``), and the secrets kept out of all of them (``redact``). Rule: rows
and files from step records and client rows; it starts no process and opens no socket.

``harness.records`` was the module that is now ``harness.records.requests``: its names
still resolve here, with a warning (docs/architecture.md).
"""

from engine.moved_modules import moved_names

__getattr__ = moved_names(
    "harness.records",
    "harness.records.requests",
    {
        "requests",
        "steps",
        "decision_log",
        "spans",
        "incremental",
        "summary",
        "request_stats",
        "redact",
    },
)
