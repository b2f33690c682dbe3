"""The session's real vLLM (tests/support/vllm_server.py): one server for every test here;
``own_store`` (tests/support/own_store.py) for the tests whose fits must not reach the
others' runs."""

from tests.support.own_store import own_store
from tests.support.vllm_server import vllm_checkpoints, vllm_python_path, vllm_server

__all__ = ["own_store", "vllm_checkpoints", "vllm_python_path", "vllm_server"]
