"""`schedscope run` as a subprocess, the way a user starts it, with a store of cost
models of the test's own (a served cell fits into the store, which must not leak into
another test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.costmodel import store as cost_store
from tests.support.paths import REPO


def schedscope_run(
    args: list[str], store: Path, extra_path: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m harness.cli run ARGS`` from the repository; ``extra_path``: a folder put
    before the repository on PYTHONPATH (a test's ``sitecustomize``, say). The PYTHONPATH
    this process was given stays after them (benchmarks/gpu.sh puts its installed wheels
    there)."""
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join(str(p) for p in (extra_path, REPO, inherited) if p)
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", cost_store.STORE_ENV: str(store)}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
