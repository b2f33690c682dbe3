"""The per-user store of fitted cost models, keyed by machine fingerprint
(:mod:`harness.costmodel.machine`): ``schedscope calibrate`` saves into it, ``schedscope
simulate`` and ``schedscope run --simulate`` look up this machine's fit in it.

Where: the platform's user cache directory (platformdirs: ``~/.cache/schedscope/
cost-models`` on Linux), or :data:`STORE_ENV` when set. One JSON file per fingerprint
key, ``cost-model-<key>.json``: a cost model file like any other (``--cost-model
FILE`` reads it), whose ``fingerprint`` field says what it was fitted on. A refit on
the same machine replaces the file. Beside it, ``cost-model-<key>.steps.npz`` holds
the step cycles it was fitted from, by source (:mod:`harness.costmodel.evidence`), when they
were step cycles: a served run's cell refits from that pool plus its own steps.

Fits of external engines (``schedscope calibrate --from-run``) live beside them as
``cost-model-target-<key>.json``, keyed by the target's fingerprint
(:mod:`harness.costmodel.target`), never this machine's: :func:`save_target`,
:func:`find_target` (``--cost-model target:<name>``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from engine.core.cost_model import CostModel, CostModelError
from harness.costmodel.evidence import Evidence
from harness.costmodel.machine import Fingerprint, FingerprintError
from harness.costmodel.target import TargetError, TargetFingerprint, is_target

#: Overrides the store's directory (tests, a shared team directory, CI).
STORE_ENV = "SCHEDSCOPE_COST_MODEL_DIR"


def store_dir() -> Path:
    """The store's directory: $SCHEDSCOPE_COST_MODEL_DIR, else the user cache's."""
    override = os.environ.get(STORE_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("schedscope", appauthor=False)) / "cost-models"


@dataclass(frozen=True)
class StoredModel:
    """One file of the store: its model and fingerprint, or why it cannot be read."""

    path: Path
    model: CostModel | None = None
    fingerprint: Fingerprint | None = None
    problem: str | None = None
    #: an external engine's fit (calibrate --from-run): its fingerprint (``fingerprint``
    #: is then None)
    target: TargetFingerprint | None = None

    @property
    def simulate_knobs(self) -> dict:
        """A target fit's knobs that simulate its engine ({} for a machine's fit)."""
        knobs = self.model.fingerprint.get("simulate_knobs") if self.model else None
        return dict(knobs) if isinstance(knobs, dict) and self.target is not None else {}

    @property
    def holdout_error(self) -> float | None:
        """The fit's held-out median relative error, when it recorded one."""
        value = (self.model.fit if self.model else {}).get("holdout_median_rel_error")
        return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Lookup:
    """The store against one fingerprint: the fit made for it (``match``, the newest
    when several), and fits for the same machine, model and executor made with another
    schedscope version or model shapes (``stale``)."""

    match: StoredModel | None
    stale: tuple[StoredModel, ...]


def path_for(fingerprint: Fingerprint, directory: Path | None = None) -> Path:
    return (directory or store_dir()) / f"cost-model-{fingerprint.key}.json"


def evidence_path_for(fingerprint: Fingerprint, directory: Path | None = None) -> Path:
    """Where the step cycles behind ``fingerprint``'s fit are kept."""
    return (directory or store_dir()) / f"cost-model-{fingerprint.key}.steps.npz"


def save(
    model: CostModel,
    fingerprint: Fingerprint,
    directory: Path | None = None,
    evidence: Evidence | None = None,
) -> Path:
    """Store ``model`` as the fit for ``fingerprint`` (recorded in the file), and
    ``evidence`` as the step cycles it was fitted from (None: it was not fitted from a
    pool, and any pool kept for the previous fit goes with it); the model's path."""
    path = path_for(fingerprint, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    pool = evidence_path_for(fingerprint, directory)
    if evidence is None:
        pool.unlink(missing_ok=True)
    else:
        evidence.save(pool)
    with_fingerprint(model, fingerprint).save(path)
    return path


def load_evidence(fingerprint: Fingerprint, directory: Path | None = None) -> Evidence:
    """The pool behind ``fingerprint``'s fit; empty when there is none. A pool that
    cannot be read raises EvidenceError (the caller says so and starts afresh)."""
    pool = evidence_path_for(fingerprint, directory)
    return Evidence.load(pool) if pool.is_file() else Evidence()


def with_fingerprint(model: CostModel, fingerprint: Fingerprint) -> CostModel:
    return dataclasses.replace(model, fingerprint=fingerprint.to_dict())


def load(path: Path) -> StoredModel:
    """One stored file read back; a file that is not a cost model with a fingerprint
    comes back with its ``problem``, not an exception (one bad file spoils no lookup)."""
    try:
        model = CostModel.load(path)
    except CostModelError as exc:
        return StoredModel(path, problem=str(exc))
    if not model.fingerprint:
        return StoredModel(path, model, problem="no fingerprint recorded")
    if is_target(model.fingerprint):
        try:
            target = TargetFingerprint.from_dict(model.fingerprint)
        except (TargetError, TypeError) as exc:
            return StoredModel(path, model, problem=f"unreadable target fingerprint: {exc}")
        return StoredModel(path, model, target=target)
    try:
        fingerprint = Fingerprint.from_dict(model.fingerprint)
    except (FingerprintError, TypeError) as exc:
        return StoredModel(path, model, problem=f"unreadable fingerprint: {exc}")
    return StoredModel(path, model, fingerprint)


def entries(directory: Path | None = None) -> list[StoredModel]:
    """Every stored file, by name; none when the store does not exist yet."""
    directory = directory or store_dir()
    if not directory.is_dir():
        return []
    return [load(p) for p in sorted(directory.glob("*.json"))]


def find(fingerprint: Fingerprint, directory: Path | None = None) -> Lookup:
    """The stored fit for ``fingerprint`` and the stale ones (:class:`Lookup`). The key
    is recomputed from each file's parts, never taken from the file."""
    matches, stale = [], []
    for entry in entries(directory):
        if entry.fingerprint is None:
            continue
        if entry.fingerprint.key == fingerprint.key:
            matches.append(entry)
        elif entry.fingerprint.machine_key == fingerprint.machine_key:
            stale.append(entry)
    newest = max(matches, key=lambda e: e.model.fitted_at if e.model else "", default=None)
    return Lookup(newest, tuple(stale))


#: ``--cost-model target:<name>``: a stored fit of an external engine.
TARGET_PREFIX = "target:"


def target_path_for(target: TargetFingerprint, directory: Path | None = None) -> Path:
    return (directory or store_dir()) / f"cost-model-target-{target.key}.json"


def save_target(
    model: CostModel, fingerprint: dict, target: TargetFingerprint, directory: Path | None = None
) -> Path:
    """Store ``model`` as the fit of the external engine ``target`` (``fingerprint``:
    its store entry, :meth:`TargetIdentity.fingerprint_dict`); a refit of the same
    target replaces it. The model's path."""
    path = target_path_for(target, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    dataclasses.replace(model, fingerprint=fingerprint).save(path)
    return path


def target_entries(directory: Path | None = None) -> list[StoredModel]:
    """The stored fits of external engines, oldest first."""
    found = [e for e in entries(directory) if e.target is not None and e.model is not None]
    return sorted(found, key=lambda e: e.model.fitted_at if e.model else "")


def find_target(name: str, directory: Path | None = None) -> StoredModel:
    """The newest stored target fit whose name or key is ``name``; LookupError lists the
    stored targets when none is."""
    stored = target_entries(directory)
    found = [e for e in stored if e.target and name in (e.target.name, e.target.key)]
    if found:
        return found[-1]
    known = ", ".join(sorted({f"{e.target.name} ({e.target.key})" for e in stored if e.target}))
    raise LookupError(
        f"no stored fit of target {name!r} in {directory or store_dir()}"
        + (f"; stored: {known}" if known else "; none stored: `schedscope calibrate --from-run`")
    )
