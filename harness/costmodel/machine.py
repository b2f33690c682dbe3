"""The machine a cost model is fitted on, as a fingerprint: what determines how long a
step takes here (the CPU and its vector instructions, the cores, the torch threads and
build, the GPU, the model's shapes, the executor and device), a short ``key`` over
them, and a one-line description.

A fit made on one machine predicts another's steps badly (docs/simulator.md); the
store of fitted models (:mod:`harness.costmodel.store`) is keyed by this fingerprint.

Every part is read without importing torch: torch's version and build from its
installed ``torch/version.py`` (the build's commit pins its BLAS and compile flags),
the CPU from ``/proc/cpuinfo`` (``platform`` elsewhere), the GPU from the NVIDIA
driver's ``/proc`` files. So a fingerprint costs milliseconds, the simulator does not
pay torch's import, and the same machine gives the same bytes in every process.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from harness.processes.cpu_split import auto_split
from harness.processes.cpu_split import serve_cores as cores_of

#: The CPU flags that change which kernels torch runs (its CPU capability, oneDNN's and
#: MKL's code paths): x86 vector and matrix extensions, Arm's NEON/SVE.
ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",  # /proc/cpuinfo's name for NEON on aarch64
    "neon",
    "sve",
    "sve2",
)

#: The parts a fit stays valid across: a stored fit whose key differs from this
#: machine's only in these is *stale* (refit), not another machine's.
VERSION_PARTS = ("schedscope", "model_config")


class FingerprintError(ValueError):
    pass


@dataclass(frozen=True)
class Fingerprint:
    """What determines a step's cost on this machine. Every field is part of ``key``."""

    cpu_model: str
    arch: str
    #: ISA_FLAGS the CPU has, sorted
    isa: tuple[str, ...]
    #: cores this process may run on
    cores: int
    #: torch's intra-op threads the fitted (or predicted) steps run with
    torch_threads: int
    #: the cores the served engine is pinned to, apart from its load generator's
    #: (harness/processes/cpu_split.py); 0: not pinned
    serve_cores: int
    #: torch's version with its build tag (2.13.0+cpu, 2.5.1+cu124)
    torch: str
    #: the commit torch was built from: pins its BLAS (MKL, OpenBLAS) and compile flags
    torch_build: str
    #: ATEN_CPU_CAPABILITY when set (it overrides the kernels torch picks), else "auto"
    cpu_capability: str
    #: "NAME, driver VERSION" of the first NVIDIA GPU; "" without one
    cuda: str
    #: the model's name and a hash of its shapes (ModelConfig)
    model: str
    model_config: str
    executor: str
    device: str
    schedscope: str

    @property
    def key(self) -> str:
        """12 hex digits over every part: equal keys, equal step costs expected."""
        return _hash(self.parts())

    @property
    def machine_key(self) -> str:
        """The key without :data:`VERSION_PARTS`: equal on the same machine, model and
        executor after schedscope or the model's shapes changed."""
        parts = self.parts()
        for name in VERSION_PARTS:
            parts.pop(name)
        return _hash(parts)

    def parts(self) -> dict:
        out = asdict(self)
        out["isa"] = list(self.isa)
        return out

    def describe(self) -> str:
        """One line for people: CPU, ISA, cores and threads, torch, GPU, model, executor."""
        isa = "/".join(self.isa) or "no listed ISA extensions"
        gpu = f", {self.cuda}" if self.cuda else ""
        cap = (
            "" if self.cpu_capability == "auto" else f", ATEN_CPU_CAPABILITY={self.cpu_capability}"
        )
        return (
            f"{self.cpu_model} ({self.arch}, {isa}), {self.cores} cores, "
            + (f"serve pinned to {self.serve_cores}, " if self.serve_cores else "")
            + f"{self.torch_threads} torch thread{'s' if self.torch_threads != 1 else ''}, "
            f"torch {self.torch}{cap}{gpu}; model {self.model} [{self.model_config}], "
            f"{self.executor} executor on {self.device}; schedscope {self.schedscope} "
            f"[key {self.key}]"
        )

    def to_dict(self) -> dict:
        """The parts, plus ``key`` and ``machine_key`` (recomputed on load, not trusted)."""
        return {**self.parts(), "key": self.key, "machine_key": self.machine_key}

    @classmethod
    def from_dict(cls, data: dict) -> Fingerprint:
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data) - {"serve_cores"})
        if missing:
            raise FingerprintError(f"fingerprint lacks {missing}")
        # a fit stored before servers were pinned ran unpinned: say so, not "unreadable"
        data = {"serve_cores": 0, **data}
        values = {k: data[k] for k in names}
        values["isa"] = tuple(values["isa"])
        return cls(**values)

    def stale_against(self, current: Fingerprint) -> list[str]:
        """The :data:`VERSION_PARTS` in which this (a stored fit's) differs from
        ``current``, as ``name a -> b``; empty when it is not stale."""
        return [
            f"{name} {getattr(self, name)} -> {getattr(current, name)}"
            for name in VERSION_PARTS
            if getattr(self, name) != getattr(current, name)
        ]


def _hash(parts: dict) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def fingerprint(
    model: str = "tiny",
    executor: str = "torch",
    device: str | None = None,
    torch_threads: int | None = None,
    serve_cores: int | None = None,
    **given,
) -> Fingerprint:
    """This machine's fingerprint for steps of ``model`` (a preset name or a checkpoint
    directory) run by ``executor`` on ``device`` (default: cuda when torch was built for
    it and an NVIDIA driver is loaded, else cpu) with ``torch_threads`` (default: what
    ``schedscope serve`` uses here) and the server pinned to ``serve_cores`` cores (0:
    not pinned; default: as the automatic ``--cpu-split`` pins it). Any other part may
    be given instead of read (``given``: tests, or a fit's own facts)."""
    unknown = sorted(set(given) - {f.name for f in fields(Fingerprint)})
    if unknown:
        raise TypeError(f"fingerprint() got unknown parts {unknown}")
    if Path(model).is_dir():  # a checkpoint: the same wherever it is named from
        model = str(Path(model).resolve())
    # each reader returns its Fingerprint field's value: str, int, bool or a tuple of str
    readers: dict[str, Callable[[], Any]] = {
        "cpu_model": lambda: _cpu()[0],
        "arch": lambda: platform.machine() or "unknown",
        "isa": lambda: _cpu()[1],
        "cores": _cores,
        "serve_cores": lambda: cores_of(auto_split()) if serve_cores is None else serve_cores,
        "torch_threads": lambda: (
            torch_threads or serving_torch_threads(values.get("serve_cores") or None)
        ),
        "torch": lambda: _torch_build()[0],
        "torch_build": lambda: _torch_build()[1],
        "cpu_capability": lambda: os.environ.get("ATEN_CPU_CAPABILITY") or "auto",
        "cuda": _nvidia_gpu,
        "model": lambda: model,
        "model_config": lambda: model_config_hash(model),
        "executor": lambda: executor,
        "device": lambda: device or ("cuda" if _nvidia_gpu() and _torch_build()[2] else "cpu"),
        "schedscope": lambda: _version("schedscope"),
    }
    values: dict[str, Any] = {}
    for name, read in readers.items():  # in order: torch_threads reads serve_cores
        values[name] = given[name] if name in given else read()
    values["isa"] = tuple(sorted(values["isa"]))
    return Fingerprint(**values)


def model_config_hash(model: str) -> str:
    """12 hex digits over the shapes of ``model`` (a preset or a checkpoint directory's
    config.json), read without torch; "unknown" when neither resolves."""
    from engine.worker.model_config import ModelConfig

    try:
        directory = Path(model)
        if directory.is_dir():
            config = ModelConfig.from_json(directory / "config.json")
        else:
            config = ModelConfig.preset(model)
    except (OSError, ValueError):
        return "unknown"
    return _hash(asdict(config))


@cache
def _cpu() -> tuple[str, tuple[str, ...]]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux
        text = ""
    return cpu_from_cpuinfo(text)


def cpu_from_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(CPU model, the ISA_FLAGS it has) from /proc/cpuinfo's ``text``; the model from
    ``platform`` when the text names none."""
    model, flags = "", set[str]()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if not model and name in ("model name", "hardware", "cpu model", "processor"):
            # x86's and aarch64's "processor" lines are core numbers: not a model
            if not value.strip().isdigit():
                model = value.strip()
        elif not flags and name in ("flags", "features"):
            flags = set(value.split())
    model = model or platform.processor() or platform.machine() or "unknown cpu"
    return model, tuple(sorted(f for f in ISA_FLAGS if f in flags))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def serving_torch_threads(cores: int | None = None) -> int:
    """torch's intra-op threads when serving: one fewer than ``cores`` (default: the
    cores this process may run on; a server pinned apart from its load generator runs
    on those it was given: harness/processes/cpu_split.py).

    torch's CPU threads (OpenMP) wait for each other at the end of every parallel
    region; when the event loop, the tokenizer or a co-located load generator takes one
    of their cores, the whole region waits for the descheduled thread. Measured on 2
    cores (tiny model, one stream): a decode step takes 5.3 ms served with 2 threads,
    2.3 ms with 1, and 1.6 ms offline with 2 (benchmarks/bench_serving.py).
    """
    return max(1, (cores or _cores()) - 1)


@cache
def _torch_build() -> tuple[str, str, str | None]:
    """(version, git commit, CUDA version or None) of the installed torch, read from its
    ``version.py`` without importing it; ("none", "", None) without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return "none", "", None
    values: dict[str, object] = {}
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, SyntaxError):
        return _version("torch"), "", None
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    cuda = values.get("cuda")
    return (
        str(values.get("__version__") or _version("torch")),
        str(values.get("git_version") or ""),
        str(cuda) if cuda else None,
    )


@cache
def _nvidia_gpu() -> str:
    """ "NAME, driver VERSION" of the first NVIDIA GPU from the driver's /proc files;
    "" when no NVIDIA driver is loaded."""
    gpus = Path("/proc/driver/nvidia/gpus")
    try:
        first = min(gpus.iterdir())
        info = (first / "information").read_text(errors="replace")
        driver = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except (OSError, ValueError):
        return ""
    name = next(
        (
            v.strip()
            for k, _, v in (line.partition(":") for line in info.splitlines())
            if k.strip() == "Model"
        ),
        "NVIDIA GPU",
    )
    words = driver.split()
    release = next((w for w in words if w[:1].isdigit() and "." in w), "unknown")
    return f"{name}, driver {release}"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
