"""The session's real vLLM (tests/support/vllm_server.py): one server for every test here."""

from tests.support.vllm_server import vllm_checkpoints, vllm_python_path, vllm_server

__all__ = ["vllm_checkpoints", "vllm_python_path", "vllm_server"]
