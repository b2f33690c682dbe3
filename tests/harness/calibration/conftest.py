"""``own_store`` (tests/support/own_store.py) for the tests here whose runs fit cost models."""

from tests.support.own_store import own_store

__all__ = ["own_store"]
