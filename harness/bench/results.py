"""The results file of a benchmark run (docs/benchmarks.md, "The results file"): the
date, this machine's fingerprint (:mod:`harness.costmodel.machine`), the versions
(:mod:`harness.run.versions`), each benchmark's status and every figure, so a result
can itself be compared and gated later.

Default place: ``benchmarks/results/<UTC date and time>-<machine key>.json`` (the
machine key is the fingerprint's, without the schedscope version: one machine's
results sort together whatever was measured).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from harness.bench.collect import BENCHMARKS_DIR
from harness.bench.figure import MET, MISSED, NO_TARGET, NOT_MEASURED
from harness.bench.runner import SKIPPED, BenchResult
from harness.costmodel.machine import Fingerprint, fingerprint
from harness.run.versions import versions

SCHEMA_VERSION = 1
RESULTS_DIR = BENCHMARKS_DIR / "results"


def machine_fingerprint(device: str | None = None) -> Fingerprint:
    """This machine as the benchmarks see it: the bundled tiny model on the torch
    executor, on ``device`` (default: cuda when present)."""
    return fingerprint("tiny", "torch", device)


def default_out(fp: Fingerprint, now: datetime, folder: Path = RESULTS_DIR) -> Path:
    return folder / f"{now.strftime('%Y%m%d-%H%M%S')}-{fp.machine_key}.json"


def results_document(
    results: list[BenchResult],
    fp: Fingerprint,
    now: datetime,
    quick: bool,
    device: str | None,
    command: list[str],
) -> dict:
    """Top-level keys: date, fingerprint (its parts, key, machine_key, description),
    versions, quick, device, command, benchmarks (status, wall time, error), figures
    (every figure, each with its benchmark), summary (counts by verdict)."""
    figures = [{"benchmark": r.benchmark.name, **f.to_dict()} for r in results for f in r.figures]
    counts = {v: sum(1 for f in figures if f["verdict"] == v) for v in (MET, MISSED, NO_TARGET)}
    counts["not_measured"] = sum(1 for f in figures if f["verdict"] == NOT_MEASURED)
    return {
        "schema_version": SCHEMA_VERSION,
        "date": now.astimezone(UTC).isoformat(timespec="seconds"),
        "fingerprint": {**fp.to_dict(), "description": fp.describe()},
        "versions": versions(),
        "quick": quick,
        "device": device,
        "command": command,
        "benchmarks": [{k: v for k, v in r.to_dict().items() if k != "figures"} for r in results],
        "figures": figures,
        "summary": {
            **{k.replace(" ", "_"): v for k, v in counts.items()},
            "benchmarks": len(results),
            "failed": [r.benchmark.name for r in results if r.failed],
            "skipped": [r.benchmark.name for r in results if r.status == SKIPPED],
        },
    }


def write_results(document: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path
