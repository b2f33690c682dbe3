"""A test's own store of fitted cost models (harness/costmodel/store.py).

tests/conftest.py gives the whole session one private store. A test whose runs fit cost
models into the store (a served cell fits its steps) takes ``own_store`` so that no fit
leaks into another test's simulations: by name as an argument, or for every test of a
module with ``pytestmark = [pytest.mark.usefixtures("own_store")]``. tests/harness/run/
conftest.py makes it available there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.costmodel import store as cost_store


@pytest.fixture
def own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``STORE_ENV`` set, for this test and the subprocesses it starts, to
    ``tmp_path / "cost-model-store"`` (not created here); returns that path."""
    store = tmp_path / "cost-model-store"
    monkeypatch.setenv(cost_store.STORE_ENV, str(store))
    return store
