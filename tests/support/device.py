"""The device the torch-executor tests run the model on: ``cpu`` unless
``SCHEDSCOPE_TEST_DEVICE=cuda`` (benchmarks/gpu.sh sets it to run ``pytest -m
torch_model`` on a GPU). The model-level tests (tests/engine/worker/test_model.py,
test_weights.py) build their tensors on the CPU and stay there; the tests that go
through the model runner and the engine (test_model_runner.py, the profiled
calibration) take this device.
"""

from __future__ import annotations

import os

import pytest

DEVICE_ENV = "SCHEDSCOPE_TEST_DEVICE"
DEVICES = ("cpu", "cuda")


def device_under_test() -> str:
    """``$SCHEDSCOPE_TEST_DEVICE`` (default cpu). A value that is no device, or cuda
    where torch sees none, fails the test that asked: a GPU run must never quietly
    test the CPU instead."""
    device = os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    if device not in DEVICES:
        pytest.fail(f"{DEVICE_ENV}={device!r}: expected one of {', '.join(DEVICES)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.fail(f"{DEVICE_ENV}=cuda, but torch sees no CUDA device here")
    return device
