"""Locust imported into the test process without gevent's monkey-patching.

``import locust`` runs gevent's ``monkey.patch_all()`` unless ``LOCUST_SKIP_MONKEY_PATCH``
is set: sockets, threads, ``select`` and ssl become gevent's for the whole process. A
test module that imports Locust (its message class, its runners, the profile's
listeners in ``harness.loadgen.locust_user``) is imported when pytest collects, so the
patching reached every test of the session, and the engine's aiohttp tests then failed
("Cannot run the event loop while another loop is running"). Imported first by
tests/conftest.py, Locust stays unpatched here; the variable is set only for that
import, so the Locust processes the tests start patch themselves as a user's do.
"""

from __future__ import annotations

import os

SKIP = "LOCUST_SKIP_MONKEY_PATCH"


def import_unpatched() -> None:
    before = os.environ.get(SKIP)
    os.environ[SKIP] = "1"
    try:
        import locust  # noqa: F401 - imported once, unpatched, for the whole session
    finally:
        if before is None:
            del os.environ[SKIP]
        else:
            os.environ[SKIP] = before
