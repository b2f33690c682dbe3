"""The store of fitted cost models: where it is, what a saved fit records, and what a
lookup finds for a fingerprint (the match, the stale fits, nothing from another
machine; a bad file spoils nothing)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.core.cost_model import CostModel
from harness.costmodel import store as cost_store
from harness.costmodel.machine import Fingerprint, fingerprint

PARTS = dict(
    cpu_model="AMD EPYC 9B14",
    isa=("avx2", "avx512f"),
    torch="2.13.0+cpu",
    torch_build="abc",
    cuda="",
    schedscope="0.1.0",
    model_config="m1",
)


@pytest.fixture
def store(tmp_path, monkeypatch):
    directory = tmp_path / "store"
    monkeypatch.setenv(cost_store.STORE_ENV, str(directory))
    return directory


def machine(**changes) -> Fingerprint:
    return fingerprint("tiny", torch_threads=1, **{**PARTS, **changes})


def fitted(step_overhead_s: float = 5e-3, error: float = 0.04, at: str = "2026-12-01") -> CostModel:
    return dataclasses.replace(
        CostModel(),
        step_overhead_s=step_overhead_s,
        fitted_at=at,
        source="steps",
        fit={"holdout_median_rel_error": error},
    )


def test_the_variable_sets_the_store_else_the_user_cache(store, monkeypatch):
    assert cost_store.store_dir() == store
    monkeypatch.delenv(cost_store.STORE_ENV)
    default = cost_store.store_dir()
    assert default.name == "cost-models" and "schedscope" in default.parts


def test_a_saved_fit_round_trips_with_its_fingerprint(store):
    path = cost_store.save(fitted(), machine())
    assert path.parent == store and machine().key in path.name
    data = json.loads(path.read_text())
    assert data["fingerprint"]["key"] == machine().key
    entry = cost_store.load(path)
    assert entry.problem is None and entry.fingerprint == machine()
    assert entry.model.step_overhead_s == 5e-3 and entry.holdout_error == 0.04
    assert CostModel.load(path) == entry.model  # an ordinary --cost-model FILE too
    assert cost_store.entries() == [entry]


def test_a_lookup_finds_this_machines_fit_and_not_anothers(store):
    assert cost_store.find(machine()) == cost_store.Lookup(None, ())  # no store yet
    cost_store.save(fitted(1e-3), machine(cpu_model="Intel Xeon"))
    assert cost_store.find(machine()).match is None
    cost_store.save(fitted(2e-3), machine())
    found = cost_store.find(machine())
    assert found.match is not None and found.match.model.step_overhead_s == 2e-3
    assert found.stale == ()


def test_a_refit_replaces_the_stored_one(store):
    cost_store.save(fitted(1e-3, at="2026-12-01"), machine())
    cost_store.save(fitted(2e-3, at="2026-12-02"), machine())
    assert len(cost_store.entries()) == 1
    assert cost_store.find(machine()).match.model.step_overhead_s == 2e-3


@pytest.mark.parametrize("change", [{"schedscope": "0.0.9"}, {"model_config": "m0"}])
def test_a_fit_from_another_version_or_model_shapes_is_stale_not_a_match(store, change):
    path = cost_store.save(fitted(), machine(**change))
    found = cost_store.find(machine())
    assert found.match is None
    assert [e.path for e in found.stale] == [path]


def test_bad_files_are_listed_with_their_problem_and_spoil_no_lookup(store):
    cost_store.save(fitted(), machine())
    (store / "broken.json").write_text("{not json")
    CostModel().save(store / "old.json")  # a fit written before fingerprints
    problems = {e.path.name: e.problem for e in cost_store.entries()}
    assert "not valid JSON" in problems["broken.json"]
    assert problems["old.json"] == "no fingerprint recorded"
    assert cost_store.find(machine()).match is not None


def test_the_key_is_recomputed_from_the_files_parts(store):
    """A file whose stored key was edited to this machine's is still another machine's."""
    other = machine(cpu_model="Intel Xeon")
    path = cost_store.save(fitted(), other)
    data = json.loads(path.read_text())
    data["fingerprint"]["key"] = machine().key
    path.write_text(json.dumps(data))
    assert cost_store.find(machine()).match is None
