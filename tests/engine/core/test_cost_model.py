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


@pytest.mark.parametrize(
    "name, value",
    [
        ("step_overhead_s", float("nan")),  # hung `schedscope simulate`
        ("step_overhead_s", float("inf")),  # every latency null, exit 0
        ("client_latency_s", float("nan")),
        ("decode_seq_s", True),  # a boolean read as 1.0
        ("prefill_token_s", 1e300),  # OverflowError in the simulator
        ("swap_block_s", -1e-6),
        ("mixed_step_s", "0.001"),
    ],
)
def test_every_parameter_must_be_a_finite_bounded_number(name, value):
    with pytest.raises(CostModelError, match=name):
        CostModel.from_dict({name: value})


def test_a_file_with_nan_is_refused_when_loaded(tmp_path):
    path = tmp_path / "m.json"
    path.write_text('{"step_overhead_s": NaN}')  # Python's json reads NaN and Infinity
    with pytest.raises(CostModelError, match="step_overhead_s"):
        CostModel.load(path)
