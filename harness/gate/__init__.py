"""``schedscope gate``: a run compared with a baseline under TOML rules (docs/gate.md).

One concept per module: :mod:`~harness.gate.config` (the rules), :mod:`~harness.gate.sides`
(reading a run directory, a baseline file or a summary.json), :mod:`~harness.gate.baseline`
(baseline files and their identity), :mod:`~harness.gate.evaluate` (the lines and their
statistics, the report's bootstrap), :mod:`~harness.gate.outputs` (Markdown, JUnit, JSON)
and :mod:`~harness.gate.gate` (the whole gate, its exit code).
"""
