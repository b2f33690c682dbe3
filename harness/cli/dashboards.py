"""``schedscope dashboards build|push``: the Grafana dashboards built as code
(:mod:`harness.grafana.dashboards`), written as JSON or uploaded to a Grafana
(:mod:`harness.grafana.push`; docs/dashboards.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import console, err_console

dashboards_app = typer.Typer(
    help="Grafana dashboards built as code: build the JSON, push it to a Grafana "
    "(docs/dashboards.md).",
    no_args_is_help=True,
)


@dashboards_app.command("build")
def dashboards_build(
    out: Path = typer.Option(
        Path("dashboards"),
        "--out",
        help="Directory for the dashboard JSON files (the repository's dashboards/).",
    ),
) -> None:
    """Regenerate the dashboards' JSON from harness/grafana/dashboards.py."""
    from harness.grafana.dashboards import write_dashboards

    try:
        paths = write_dashboards(out)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot write {out}: {exc.strerror or exc}", param_hint="--out"
        ) from None
    for path in paths:
        console.print(f"wrote {path}")


@dashboards_app.command("push")
def dashboards_push(
    grafana_url: str = typer.Option(
        ...,
        "--grafana-url",
        envvar="GRAFANA_URL",
        help="Grafana's base URL, e.g. http://localhost:3000.",
    ),
    folder_uid: str | None = typer.Option(
        None, "--folder-uid", help="Put the dashboards in this folder (default: General)."
    ),
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="Seconds per HTTP request."),
) -> None:
    """Upload the dashboards to Grafana, overwriting by uid (token from GRAFANA_TOKEN)."""
    import math
    import os

    from harness.grafana.dashboards import DASHBOARDS, dashboard_dict
    from harness.grafana.push import TOKEN_ENV, PushError, push_dashboards

    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise typer.BadParameter(f"{timeout_s!r}: must be > 0", param_hint="--timeout-s")
    token = os.environ.get(TOKEN_ENV) or None
    if token is None:
        err_console.print(f"{TOKEN_ENV} is not set: pushing without credentials")
    try:
        results = push_dashboards(
            grafana_url,
            token,
            [dashboard_dict(uid) for uid in DASHBOARDS],
            folder_uid=folder_uid,
            timeout_s=timeout_s,
        )
    except PushError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    for result in results:
        where = f" at {result.url}" if result.url else ""
        console.print(
            f"pushed {result.uid} (version {result.version}){where}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
