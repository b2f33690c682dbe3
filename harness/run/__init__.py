"""``schedscope run``: the policies (or a whole matrix of cells) under Locust load, one
served engine per cell, records and metrics collected, then the report (docs/run.md).

One concept per module: ``matrix`` (cells from flags or a TOML run file), ``server``
(one ``schedscope serve`` subprocess), ``loadgen`` (one Locust subprocess), ``scrape``
(``/metrics`` every second into metrics.parquet; or a real Prometheus), ``live``
(live figures from the records being written), ``join`` (client + engine records into
requests.parquet, steps and spans on one clock), ``versions``, ``settings`` (what the
command sets, typed, from the command line to each cell), a cell by concern:
``load_cell`` (a served or --target cell's steps), ``cell_telemetry`` (its metrics
source and OTLP receivers during the load), ``collect`` (its files from the records),
``simulated_cell``, ``cell_result`` (what it measured, its run.json); ``runner`` (the
matrix, the summary table, the report).
"""

from harness.run.matrix import Cell, RunFileError, RunPlan, load_run_file
from harness.run.runner import RunOptions, run_matrix
from harness.run.settings import CellMachine, RunSettings, RunSettingsError

__all__ = [
    "Cell",
    "CellMachine",
    "RunFileError",
    "RunOptions",
    "RunPlan",
    "RunSettings",
    "RunSettingsError",
    "load_run_file",
    "run_matrix",
]
