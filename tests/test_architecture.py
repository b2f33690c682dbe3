"""The dependency rules of docs/architecture.md hold, and would catch a break.

The rules themselves are import-linter contracts in pyproject.toml (layers of
``engine/``, the engine never importing the harness, scheduling code free of torch,
sockets and telemetry, no import cycles with type-only imports counted).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.slow]

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
    harness_layers = next(c for c in by_type["layers"] if c.get("containers") == ["harness"])
    assert harness_layers["layers"][0] == "cli"
    assert harness_layers["layers"][-1] == "profiles | processes"
    # every folder of harness/ has its place in the layers, and no module lies loose
    folders = {p.parent.name for p in (REPO / "harness").glob("*/__init__.py")}
    named = {n.strip() for layer in harness_layers["layers"] for n in layer.split("|")}
    assert folders == named
    assert [p.name for p in (REPO / "harness").glob("*.py")] == ["__init__.py"]


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
        # the harness's records importing a run (records sit below everything that runs)
        ("harness/records/steps.py", "import harness.run\n", "Harness layers"),
        # the machine's fingerprint reaching up into the server for a default
        (
            "harness/costmodel/machine.py",
            "from harness.serve.server import serve\n",
            "Harness layers",
        ),
        # two folders of one harness layer importing each other
        ("harness/loadgen/clock.py", "import harness.simulate.driver\n", "Harness layers"),
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


def test_the_repository_cites_nothing_outside_itself():
    """A user who clones schedscope has only the repository: no code, test or doc may
    send them to the developers' private notes, and tests say what they check rather
    than which issue asked for it."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    if not tracked:  # not a git checkout (a source archive): check what is on disk
        tracked = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()]
    suffixes = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg"}
    # the private notes are upper-case file names (docs/metrics.md is the user's own)
    outside = re.compile(
        r"\.\./shared|\bshared/|(?<![\w/])(DESIGN|METRICS|FACTS|STYLE)\.md|(?i:scheduler[ -]guide)"
    )
    issue = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = []
    for name in tracked:
        path = REPO / name
        if path.suffix not in suffixes or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line) or (name.startswith("tests/") and issue.search(line)):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
