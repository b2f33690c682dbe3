"""``schedscope worker``: one load-generator worker of a distributed ``schedscope run
--expect-workers N`` (or of any ``locust --master``), started on another machine
(docs/run.md, "Load from several machines")."""

from __future__ import annotations

import subprocess

import typer

from harness.cli.app import err_console


def worker(
    master_host: str = typer.Option(
        ..., "--master-host", help="The machine running `schedscope run --expect-workers N`."
    ),
    master_port: int = typer.Option(
        5557, "--master-port", help="Its --master-port (Locust's default 5557)."
    ),
    records_dir: str = typer.Option(
        "runs/locust",
        "--records-dir",
        help="This machine's local copy of its rows (worker-<index>-<pid>/); the rows also "
        "go to the master, which writes the run's records.",
    ),
) -> None:
    """Run one Locust worker for a master elsewhere: it takes the locustfile, options and
    its share of the schedule from the master, sends its records and clock probes back,
    and exits with the master's run. Exit code: Locust's."""
    from harness.run.loadgen import worker_command
    from harness.run.server import repo_env

    if not 0 < master_port < 65536:
        raise typer.BadParameter(f"{master_port} is not a port", param_hint="--master-port")
    cmd = [*worker_command(master_host, master_port), "--records-dir", records_dir]
    err_console.print(" ".join(cmd[2:]), soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(subprocess.call(cmd, env=repo_env()))
