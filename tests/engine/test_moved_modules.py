"""Code written against the flat ``engine/`` of earlier versions keeps working: each old
module path is the moved module itself (not a copy: classes stay identical), and
importing it warns with the new path."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings

import pytest

from engine.moved_modules import MOVED_MODULES
from harness import MOVED_MODULES as HARNESS_MOVED_MODULES
from harness import MOVED_NAMES as HARNESS_MOVED_NAMES
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


def test_every_old_harness_path_is_the_moved_module_and_warns():
    result = _probe(HARNESS_MOVED_MODULES)
    assert set(result) == set(HARNESS_MOVED_MODULES)
    for old, new in HARNESS_MOVED_MODULES.items():
        assert result[old]["same"], old
        assert result[old]["warned"] == [f"{old} moved to {new}"], old


NAMES_PROBE = """
import importlib, json, sys, warnings
result = {}
for package, new in json.loads(sys.argv[1]).items():
    module = importlib.import_module(new)
    names = [n for n in vars(module) if not n.startswith("_") and
             getattr(getattr(module, n), "__module__", None) == new]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module(package)
        same = all(getattr(old, n) is getattr(module, n) for n in names)
        again = [getattr(old, n) for n in names]  # a second read does not warn again
    result[package] = {
        "names": names,
        "same": same,
        "warned": sorted(str(w.message) for w in caught if w.category is DeprecationWarning),
    }
print(json.dumps(result))
"""


def test_a_module_that_became_a_folder_still_gives_its_names_and_warns_once_each():
    out = subprocess.run(
        [sys.executable, "-c", NAMES_PROBE, json.dumps(HARNESS_MOVED_NAMES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(out.stdout)
    assert set(result) == {"harness.records", "harness.serve", "harness.simulate"}
    for package, new in HARNESS_MOVED_NAMES.items():
        names = result[package]["names"]
        assert names, package  # the old module's classes and functions, read through it
        assert result[package]["same"], package
        assert result[package]["warned"] == sorted(
            f"{package}.{n} moved to {new}.{n}" for n in names
        )


def test_a_folder_that_replaced_a_module_still_imports_its_own_submodules():
    from harness.records import steps
    from harness.records.steps import StepLog

    assert steps.StepLog is StepLog
    with pytest.raises(ImportError):
        exec("from harness.records import no_such_name")


def test_an_unknown_engine_module_is_still_an_import_error():
    out = subprocess.run(
        [sys.executable, "-c", "import engine.no_such_module"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr
