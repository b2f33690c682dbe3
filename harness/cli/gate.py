"""``schedscope gate``: compare a run with a baseline under the rules of a TOML file and
exit 0 (pass), 1 (a regression) or 2 (a usage or data error) (docs/gate.md)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.text import Text

from harness.cli.app import console, err_console

ALLOW_HELP = (
    "Compare although the baseline differs in this identity key (profile, seed, schedule, "
    "schema_version, machine), or it is not known on both sides; repeatable. For a "
    "deliberate comparison only."
)


def gate(
    baseline: list[Path] = typer.Option(
        ...,
        "--baseline",
        help="The baseline: a run directory, a baseline file (schedscope baseline update) "
        "or a summary.json. Repeat it to pool several runs of one schedule as repeats.",
    ),
    current: list[Path] = typer.Option(
        ...,
        "--current",
        help="The run to gate: a run directory, a baseline file or a summary.json; repeat "
        "it to pool several runs.",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Rules (TOML, docs/gate.md); default: p95 TTFT and E2E of every class within "
        "+10%, error rate <= 1%.",
    ),
    junit: Path | None = typer.Option(None, "--junit", help="Write JUnit XML here."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the result as JSON here."),
    allow_mismatch: list[str] = typer.Option([], "--allow-mismatch", help=ALLOW_HELP),
) -> None:
    """Gate CI on latency regressions: every rule per cell and class, noise-aware for real
    runs, exact for simulated ones (docs/gate.md)."""
    from harness.gate import outputs
    from harness.gate.config import GateConfigError, default_config, load_config
    from harness.gate.gate import USAGE, run_gate
    from harness.gate.sides import GateInputError

    try:
        rules = load_config(config) if config is not None else default_config()
        result = run_gate(baseline, current, rules, set(allow_mismatch))
    except (GateConfigError, GateInputError) as exc:
        err_console.print(Text.assemble(("gate: error:", "red"), f" {exc}"), soft_wrap=True)
        raise typer.Exit(USAGE) from None
    except Exception as exc:  # never exit 1 (a regression) for a fault of the data or ours
        err_console.print(
            Text.assemble(
                ("gate: internal error", "red"),
                f" ({type(exc).__name__}: {exc}); the inputs could not be gated",
            ),
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(USAGE) from None
    code = result.exit_code
    title = "schedscope gate: " + ", ".join(str(p) for p in current)
    kind = result.diagnosis.kind if code else None
    table = outputs.markdown(result.checks, result.notes, code, title, kind)
    console.print(table, markup=False, highlight=False, soft_wrap=True)
    for line in outputs.failure_lines(result.checks):
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        if summary_file:
            with open(summary_file, "a", encoding="utf-8") as handle:
                handle.write(table + "\n")
        if junit is not None:
            outputs.junit(result.checks, junit)
        if json_out is not None:
            body = outputs.as_json(
                result.checks, result.notes, code, result.sides(), result.diagnosis.to_dict()
            )
            outputs.write_json(body, json_out)
    except OSError as exc:
        err_console.print(
            Text.assemble(("gate: error:", "red"), f" cannot write {exc.filename}: {exc.strerror}"),
            soft_wrap=True,
        )
        raise typer.Exit(USAGE) from None
    if kind:
        console.print(outputs.kind_line(kind), markup=False)
    console.print(outputs.verdict_line(result.checks, code), markup=False)
    raise typer.Exit(code)
