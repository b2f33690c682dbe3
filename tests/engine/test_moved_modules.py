"""Code written against the flat ``engine/`` of earlier versions keeps working: each old
module path is the moved module itself (not a copy: classes stay identical), and
importing it warns with the new path."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings

from engine.moved_modules import MOVED_MODULES
from harness import MOVED_MODULES as HARNESS_MOVED_MODULES
from tests.support.paths import REPO

PROBE = """
import importlib, json, sys, warnings
moved = json.loads(sys.argv[1])
result = {}
for old, new in moved.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    result[old] = {
        "same": module is importlib.import_module(new),
        "warned": [str(w.message) for w in caught if w.category is DeprecationWarning],
    }
print(json.dumps(result))
"""


def _probe(moved: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(moved)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def test_every_old_engine_path_is_the_moved_module_and_warns():
    result = _probe(MOVED_MODULES)
    assert set(result) == set(MOVED_MODULES)
    for old, new in MOVED_MODULES.items():
        assert result[old]["same"], old
        assert result[old]["warned"] == [f"{old} moved to {new}"], old


def test_an_old_path_gives_the_same_classes():
    from engine.core.sched.scheduler import Scheduler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("engine.scheduler")
    assert old.Scheduler is Scheduler


def test_the_harness_profile_hook_keeps_its_old_path():
    result = _probe(HARNESS_MOVED_MODULES)
    assert all(entry["same"] and entry["warned"] for entry in result.values()), result


def test_an_unknown_engine_module_is_still_an_import_error():
    out = subprocess.run(
        [sys.executable, "-c", "import engine.no_such_module"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr
