"""Import paths of modules that moved when ``engine/`` was grouped into layers.

``engine/`` was one flat folder until the modules moved into subpackages; code written
against the flat paths (``from engine.scheduler import Scheduler``) keeps working: the
old name is an alias of the new module — the same module object, not a copy — and
importing it warns once with the new path. New code uses the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Old flat module name -> its home now.
MOVED_MODULES: dict[str, str] = {
    "engine.request": "engine.core.request",
    "engine.sequence": "engine.core.sequence",
    "engine.decisions": "engine.core.decisions",
    "engine.clock": "engine.core.clock",
    "engine.block_manager": "engine.core.block_manager",
    "engine.memory": "engine.core.kv_plan",
    "engine.cost_model": "engine.core.cost_model",
    "engine.prefill_groups": "engine.core.prefill_groups",
    "engine.token_timing": "engine.core.token_timing",
    "engine.policy": "engine.core.sched.policy",
    "engine.waiting_queue": "engine.core.sched.waiting_queue",
    "engine.admission": "engine.core.sched.admission",
    "engine.batching": "engine.core.sched.batching",
    "engine.preemption": "engine.core.sched.preemption",
    "engine.scheduler": "engine.core.sched.scheduler",
    "engine.scheduler_output": "engine.core.sched.scheduler_output",
    "engine.step_record": "engine.records.step_record",
    "engine.observers": "engine.records.observers",
    "engine.model": "engine.worker.model",
    "engine.model_config": "engine.worker.model_config",
    "engine.model_runner": "engine.worker.model_runner",
    "engine.sampler": "engine.worker.sampler",
    "engine.weights": "engine.worker.weights",
    "engine.host_memory": "engine.worker.host_memory",
    "engine.cost_fit": "engine.sim.cost_fit",
    "engine.calibration": "engine.sim.calibration",
    "engine.async_engine": "engine.serving.async_engine",
    "engine.engine_core": "engine.serving.engine_core",
    "engine.process_engine": "engine.serving.process_engine",
    "engine.tokenizer": "engine.serving.tokenizer",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.target}", DeprecationWarning, stacklevel=3)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        # The target module already ran; the import system only records the alias.
        pass


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 - the finder protocol
        new = self.moved.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install_moved_module_aliases(moved: dict[str, str] = MOVED_MODULES) -> None:
    """Let the old module paths in ``moved`` resolve to their new homes. Idempotent per
    mapping; ``harness`` installs its own mapping the same way."""
    if not any(isinstance(f, _MovedModuleFinder) and f.moved is moved for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder(moved))


def moved_names(package: str, new_module: str, submodules: set[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for a package that took the place of a module
    of the same name (``harness.records`` was a module, is now a folder): a name the old
    module had is read from ``new_module``, with a warning naming its new home. The
    package's own submodules are left to the import system."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the PEP 562 hook's name
        if name.startswith("__") or name in submodules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(new_module)
        try:
            value = getattr(module, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        warnings.warn(
            f"{package}.{name} moved to {new_module}.{name}", DeprecationWarning, stacklevel=2
        )
        # kept on the package: warned once, as an old module path is
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def split_names(module: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for a module whose contents were split into
    several: a name in ``homes`` is read from its new module (``homes[name]``), with a
    warning naming that home, once."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the PEP 562 hook's name
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        warnings.warn(
            f"{module}.{name} moved to {homes[name]}.{name}", DeprecationWarning, stacklevel=2
        )
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__
