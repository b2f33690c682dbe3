"""The dependency rules of docs/architecture.md hold, and would catch a break.

The rules themselves are import-linter contracts in pyproject.toml (layers of
``engine/``, the engine never importing the harness, scheduling code free of torch,
sockets and telemetry, no import cycles with type-only imports counted).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import REPO

REPO = REPO
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_hold():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_contracts_name_the_rules():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    by_type = {}
    for contract in contracts:
        by_type.setdefault(contract["type"], []).append(contract)
    forbidden = {
        (tuple(c["source_modules"]), tuple(c["forbidden_modules"])) for c in by_type["forbidden"]
    }
    assert (("engine",), ("harness", "loadprofiles")) in forbidden
    scheduling = next(c for c in by_type["forbidden"] if "engine.core" in c["source_modules"])
    assert {"torch", "aiohttp", "opentelemetry"} <= set(scheduling["forbidden_modules"])
    engine_layers = next(c for c in by_type["layers"] if "containers" not in c)
    assert engine_layers["layers"][0] == "engine.api"
    assert engine_layers["layers"][-1] == "engine.config"
    assert by_type["acyclic_siblings"][0]["ancestors"] == ["engine", "harness"]


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # the engine importing the harness
        ("engine/core/sched/scheduler.py", "import harness.cli\n", "never imports the harness"),
        # the scheduler touching tensors, hidden behind TYPE_CHECKING
        (
            "engine/core/sched/policy.py",
            "if TYPE_CHECKING:\n    import torch\n",
            "never touch tensors",
        ),
        # a layer importing the one above it
        ("engine/worker/sampler.py", "from engine.llm_engine import LLMEngine\n", "Engine layers"),
        # a type-only cycle between two core modules
        (
            "engine/core/decisions.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from engine.core.sequence import Sequence\n",
            "No import cycles",
        ),
    ],
)
def test_contracts_catch_a_break(tmp_path, module, line, broken):
    for name in ("engine", "harness", "loadprofiles"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    text = path.read_text()
    # after the module docstring and `from __future__` (which must stay first)
    anchor = "from __future__ import annotations\n"
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + line, 1))
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert broken in result.stdout
