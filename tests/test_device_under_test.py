"""SCHEDSCOPE_TEST_DEVICE: the device the torch-executor tests run on (benchmarks/gpu.sh
sets cuda); cpu by default, and never a quiet fallback."""

from __future__ import annotations

import pytest

from tests.support.device import DEVICE_ENV, device_under_test


def test_the_default_is_the_cpu(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert device_under_test() == "cpu"
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert device_under_test() == "cpu"


def test_a_device_that_is_none_fails_naming_it(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(pytest.fail.Exception, match="SCHEDSCOPE_TEST_DEVICE='tpu'"):
        device_under_test()


def test_cuda_without_a_cuda_device_fails_instead_of_testing_the_cpu(monkeypatch):
    import torch

    monkeypatch.setenv(DEVICE_ENV, "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pytest.fail.Exception, match="sees no CUDA device"):
        device_under_test()
