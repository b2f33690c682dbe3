"""schedscope's bundled inference engine.

Layers, lowest first (docs/architecture.md draws them; ``pyproject.toml``'s
import-linter contracts enforce them):

- ``engine.config`` — the frozen knob dataclasses every layer reads;
- ``engine.core`` — requests, sequences, decisions, KV block pools, the clock, the cost
  model; ``engine.core.sched`` — the scheduler in parts;
- ``engine.records`` — the step record and its observers; ``engine.executor`` — the
  interface a step is executed through;
- ``engine.worker`` (torch execution), then ``engine.sim`` (predicted execution and
  fitting the cost model, which profiles the worker);
- ``engine.llm_engine`` — one step: schedule -> execute -> postprocess, with any executor;
- ``engine.factory`` — an engine built by executor name;
- ``engine.telemetry`` — spans and Prometheus metrics, observers of step records;
- ``engine.serving`` — the async engine and the engine-core process;
- ``engine.api`` — the OpenAI-compatible HTTP server.

The engine never imports the harness.
"""

from engine.moved_modules import install_moved_module_aliases

install_moved_module_aliases()
