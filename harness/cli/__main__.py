"""``python -m harness.cli ARGS``: the ``schedscope`` command line (how the harness
starts its own ``schedscope serve`` subprocesses)."""

from harness.cli import app

app()
