"""The cost model file's ``fingerprint`` field: it round-trips, it is left out when
empty (a model without one keeps its bytes), and old files without it still load."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.core.cost_model import CostModel, CostModelError

FINGERPRINT = {"cpu_model": "AMD EPYC 9B14", "key": "0123456789ab"}


def test_the_fingerprint_round_trips_through_dict_and_file(tmp_path):
    model = dataclasses.replace(CostModel(), fingerprint=FINGERPRINT)
    assert CostModel.from_dict(model.to_dict()) == model
    model.save(tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["fingerprint"] == FINGERPRINT
    assert CostModel.load(tmp_path / "m.json") == model


def test_an_empty_fingerprint_is_left_out_and_an_old_file_loads(tmp_path):
    assert "fingerprint" not in CostModel().to_dict()
    old = CostModel().to_dict()
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert CostModel.load(tmp_path / "old.json") == CostModel()
    assert CostModel.load(tmp_path / "old.json").fingerprint == {}


def test_a_fingerprint_that_is_not_an_object_is_refused():
    with pytest.raises(CostModelError, match="fingerprint must be an object"):
        CostModel.from_dict({"fingerprint": "laptop"})
