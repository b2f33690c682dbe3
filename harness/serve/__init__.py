"""The engine served: ``schedscope serve``'s engine behind the HTTP server (``server``),
the engine's knobs as command-line flags (``knobs``) and live servers on loopback for
tests and benchmarks (``local_server``). Rule: it builds engines and servers; it drives
no load and writes no report.

``harness.serve`` was the module that is now ``harness.serve.server``: its names still
resolve here, with a warning (docs/architecture.md).
"""

from engine.moved_modules import moved_names

__getattr__ = moved_names(
    "harness.serve", "harness.serve.server", {"server", "knobs", "local_server"}
)
