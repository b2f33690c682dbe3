"""What every test shares: Locust imported unpatched, and a private store of cost models.

What a test needs beyond Python is marked on the test itself (markers declared in
pyproject.toml): `pytestmark` at the top of a file where every test in it needs the
component, `@pytest.mark.<name>` on a single test where only some do. A test that needs a
real component it cannot find fails in CI and skips elsewhere (tests/support/components.py).
"""

from __future__ import annotations

import os

import pytest

from tests.support.unpatched_locust import import_unpatched

# Before any test module is collected: a module that imports Locust must not patch the
# whole test process with gevent (tests/support/unpatched_locust.py).
import_unpatched()


@pytest.fixture(autouse=True, scope="session")
def _private_cost_model_store(tmp_path_factory: pytest.TempPathFactory):
    """The store of fitted cost models (harness/costmodel/store.py) in a directory of this
    session's, for every test and the subprocesses they start: no test reads or writes
    the user's cache, and simulations see no fit unless a test stores one."""
    from harness.costmodel.store import STORE_ENV

    before = os.environ.get(STORE_ENV)
    os.environ[STORE_ENV] = str(tmp_path_factory.mktemp("cost-model-store"))
    yield
    if before is None:
        os.environ.pop(STORE_ENV, None)
    else:
        os.environ[STORE_ENV] = before
