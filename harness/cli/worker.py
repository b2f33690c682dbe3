"""``schedscope worker``: one load-generator worker of a distributed ``schedscope run
--expect-workers N`` (or of any ``locust --master``), started on another machine
(docs/run.md, "Load from several machines")."""

from __future__ import annotations

import subprocess
import time

import typer

from harness.cli.app import err_console
from harness.run.loadgen import LOCUST_OK_CODES


def worker(
    master_host: str = typer.Option(
        ..., "--master-host", help="The machine running `schedscope run --expect-workers N`."
    ),
    master_port: int = typer.Option(
        5557, "--master-port", help="Its --master-port (Locust's default 5557)."
    ),
    once: bool = typer.Option(
        False,
        "--once",
        help="Serve one cell's master and exit; default: start again for the next cell's "
        "master (a run with several policies starts one master per cell) until stopped.",
    ),
    records_dir: str = typer.Option(
        "runs/locust",
        "--records-dir",
        help="This machine's local copy of its rows (worker-<index>-<pid>/); the rows also "
        "go to the master, which writes the run's records.",
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="SCHEDSCOPE_API_KEY",
        help="Bearer token for the run's --target: the master never sends its own, so each "
        "worker of a run with one needs it (better in $SCHEDSCOPE_API_KEY than on the "
        "command line).",
    ),
    worker_token: str | None = typer.Option(
        None,
        "--worker-token",
        envvar="SCHEDSCOPE_WORKER_TOKEN",
        help="The master's $SCHEDSCOPE_WORKER_TOKEN, if it has one: a master with a token "
        "gives a share only to the workers that present it (better in the environment).",
    ),
) -> None:
    """Run one Locust worker for a master elsewhere: it takes the locustfile, options and
    its share of the schedule from the master, sends its records and clock probes back.
    Each cell of the run has its own master, so the worker starts again when one ends,
    until Ctrl-C (or after one with --once). Exit code: Locust's last."""
    from harness.loadgen.master_guard import TOKEN_ENV
    from harness.loadgen.options import env_var
    from harness.run.loadgen import worker_command
    from harness.run.server import repo_env

    if not 0 < master_port < 65536:
        raise typer.BadParameter(f"{master_port} is not a port", param_hint="--master-port")
    cmd = [*worker_command(master_host, master_port), "--records-dir", records_dir]
    err_console.print(" ".join(cmd[2:]), soft_wrap=True, highlight=False, markup=False)
    env = repo_env()
    # secrets go to Locust in its environment, never on its command line (ps shows that)
    if api_key:
        env[env_var("--api-key")] = api_key
    if worker_token:
        env[TOKEN_ENV] = worker_token
    while True:
        code = subprocess.call(cmd, env=env)
        if once or code not in LOCUST_OK_CODES:  # 2: bad arguments, or killed: stop
            raise typer.Exit(code)
        time.sleep(1.0)  # the next cell's master starts a moment later
