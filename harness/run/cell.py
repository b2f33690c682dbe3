"""``harness.run.cell`` was one module for a whole cell; it is now split by concern:
the settings (``settings``), the result and its run.json (``cell_result``), a served or
--target cell's steps (``load_cell``), its telemetry while the load runs
(``cell_telemetry``), its files from the records (``collect``) and a simulated cell
(``simulated_cell``). Its public names still resolve here, with a warning, for one
release (docs/architecture.md)."""

from engine.moved_modules import split_names

__getattr__ = split_names(
    "harness.run.cell",
    {
        "CellSettings": "harness.run.settings",
        "CellResult": "harness.run.cell_result",
        "remove_raw": "harness.run.cell_result",
        "run_load_cell": "harness.run.load_cell",
        "LOCUST_SLACK_S": "harness.run.load_cell",
        "OTLP_FLUSH_WAIT_S": "harness.run.load_cell",
        "LAST_SCRAPE_WAIT_S": "harness.run.cell_telemetry",
        "SERVED_STALL_THRESHOLD_S": "harness.run.collect",
        "LOAD_CELL_FILES": "harness.run.collect",
        "run_simulated_cell": "harness.run.simulated_cell",
    },
)
