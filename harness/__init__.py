"""schedscope's harness: load profiles and the load generator, runs, the simulator's
driver, records, reports, dashboards and the ``schedscope`` command line. It drives
the engine (``engine``) or any OpenAI-compatible server; the engine never imports it.
"""

from engine.moved_modules import install_moved_module_aliases

#: Old module path -> its home now (the old path keeps working; docs/architecture.md).
MOVED_MODULES = {
    "harness.profiles.locust_hook": "harness.loadgen.expose",
}

install_moved_module_aliases(MOVED_MODULES)
