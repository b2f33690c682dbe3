"""schedscope's harness: load profiles and the load generator, runs, the simulator's
driver, records, reports, dashboards and the ``schedscope`` command line. It drives
the engine (``engine``) or any OpenAI-compatible server; the engine never imports it.
"""

from engine.moved_modules import install_moved_module_aliases

#: Old module path -> its home now (the old path keeps working; docs/architecture.md).
MOVED_MODULES = {
    "harness.profiles.locust_hook": "harness.loadgen.expose",
    # harness/ grouped into folders (docs/architecture.md, "The harness's folders")
    "harness.machine": "harness.costmodel.machine",
    "harness.cost_store": "harness.costmodel.store",
    "harness.cost_evidence": "harness.costmodel.evidence",
    "harness.cost_choice": "harness.costmodel.choice",
    "harness.calibrate": "harness.costmodel.fit",
    "harness.served_calibration": "harness.calibration.served",
    "harness.steps": "harness.records.steps",
    "harness.decision_log": "harness.records.decision_log",
    "harness.spans": "harness.records.spans",
    "harness.incremental_records": "harness.records.incremental",
    "harness.summary": "harness.records.summary",
    "harness.request_stats": "harness.records.request_stats",
    "harness.redact": "harness.records.redact",
    "harness.local_server": "harness.serve.local_server",
    "harness.knobs": "harness.serve.knobs",
    "harness.compare": "harness.simulate.compare",
    "harness.speed_band": "harness.simulate.speed_band",
    "harness.dashboards": "harness.grafana.dashboards",
    "harness.grafana_push": "harness.grafana.push",
    "harness.run_plan": "harness.run.plan",
    "harness.prometheus": "harness.run.prometheus",
    "harness.open_loop_client": "harness.loadgen.open_loop_client",
}

#: A module whose path is now a folder's: its names are read from their new module
#: (``from harness.records import RequestRecorder`` warns and works).
MOVED_NAMES = {
    "harness.records": "harness.records.requests",
    "harness.serve": "harness.serve.server",
    "harness.simulate": "harness.simulate.driver",
}

install_moved_module_aliases(MOVED_MODULES)
