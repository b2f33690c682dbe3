"""The ``schedscope`` command line (typer): ``harness.cli:app`` is the console script,
``python -m harness.cli`` the same.

One module per command; each parses and checks its arguments, calls the harness
(``harness.simulate``, ``harness.run``, ``harness.serve``, ``harness.calibration``,
``harness.report``, ``harness.grafana``, ``harness.bench``, ``harness.tune``) and maps its
errors to exit codes.
:mod:`harness.cli.app` holds the app and its consoles; the commands are registered
here, in the order ``schedscope --help`` lists them.
"""

from harness.cli import (
    baseline,
    bench,
    calibrate,
    dashboards,
    export_tokenizer,
    gate,
    recover_records,
    report,
    run,
    serve,
    simulate,
    tune,
    worker,
)
from harness.cli.app import app

app.command()(simulate.simulate)
app.command()(run.run)
app.command()(tune.tune)
app.command()(serve.serve)
app.command("export-tokenizer")(export_tokenizer.export_tokenizer)
app.command()(calibrate.calibrate)
app.command()(report.report)
app.command()(gate.gate)
app.add_typer(baseline.baseline_app, name="baseline")
app.command("recover-records")(recover_records.recover_records)
app.command()(bench.bench)
app.command()(worker.worker)
app.add_typer(dashboards.dashboards_app, name="dashboards")

__all__ = ["app"]
