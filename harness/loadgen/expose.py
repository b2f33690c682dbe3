"""The one line a profile file adds to be runnable with ``locust -f loadprofiles/X.py``.

``expose(PROFILE, globals())`` at the end of a profile file defines the Locust user
class (and its custom command-line arguments) in that module — but only when the file
is being loaded by Locust (``locust`` is already imported). Imported any other way (by
``schedscope simulate``, by ``harness.profiles.loader``, by tests), it does nothing, so
the simulator never imports Locust and never gets gevent's monkey-patching.
"""

from __future__ import annotations

import sys


def running_under_locust() -> bool:
    return "locust" in sys.modules


def expose(profile, namespace: dict) -> None:
    """Define this profile's Locust classes in ``namespace`` when run by Locust."""
    if not running_under_locust():
        return
    from harness.loadgen.locust_user import define  # imports locust: only here

    define(profile, namespace)
