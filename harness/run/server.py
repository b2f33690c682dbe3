"""One ``schedscope serve`` subprocess: started on a free port (``--port 0``, the URL
parsed from its ``schedscope serving on URL`` line), healthy when ``/health`` answers,
stopped with SIGTERM (it drains, writes its record files and exits 0) and SIGKILL only
after a timeout. Its output goes to ``serve.log`` in the cell directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TextIO

from engine.api.serving_line import serving_url
from harness.processes.cpu_split import pin
from harness.processes.stop import stop_process


class ServerStartError(RuntimeError):
    """The server did not come up; ``log_tail`` holds the end of its output."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


def repo_env() -> dict[str, str]:
    """The environment for a child that imports ``harness``/``engine``/``loadprofiles``."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": root + (os.pathsep + path if path else ""),
        "PYTHONUNBUFFERED": "1",
    }


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


class ServedEngine:
    def __init__(
        self,
        args: list[str],
        log_path: Path,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 60.0,
        cpus: tuple[int, ...] | None = None,
    ) -> None:
        """``cpus``: pin the server to these CPU ids as it starts (its load generator's
        are others: harness/processes/cpu_split.py); None: not pinned."""
        self.args = args
        self.cpus = cpus
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None
        self._log: TextIO | None = None  # serve.log, open from start to stop
        self.url = ""
        self.health: dict = {}
        self.exit_code: int | None = None
        self.killed = False

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "harness.cli", "serve", "--port", "0", *self.args]

    def _fail_if_dead_or_late(self, deadline: float, before: str, late: str) -> None:
        """Raise ServerStartError if the server exited (``... exited with N {before}``)
        or the start deadline passed (``{late} within T s``; the server is stopped)."""
        process = self.process
        assert process is not None, "called by start, after the Popen"
        if process.poll() is not None:
            self.exit_code = process.returncode
            raise ServerStartError(
                f"schedscope serve exited with {self.exit_code} {before}", self.log_tail()
            )
        if time.monotonic() > deadline:
            self.stop()
            raise ServerStartError(f"{late} within {self.start_timeout_s:g} s", self.log_tail())

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            self.command,
            env=repo_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        if self.cpus:  # before it starts torch's threads, which inherit it
            pin(self.process.pid, self.cpus)
        deadline = time.monotonic() + self.start_timeout_s
        while not self.url:
            self.url = serving_url(self.log_path.read_text(errors="replace")) or ""
            if self.url:
                break
            self._fail_if_dead_or_late(
                deadline, "before serving", "schedscope serve did not print its serving line"
            )
            time.sleep(0.1)
        while True:
            try:
                self.health = get_json(self.url + "/health")
                if self.health.get("status") == "ok":
                    return self.url
            except OSError:
                pass
            self._fail_if_dead_or_late(deadline, "before /health answered", "/health not ok")
            time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM, wait (the server drains and writes its records), SIGKILL after the
        timeout. Returns the exit code."""
        if self.process is None:
            return None
        if stop_process(self.process, self.stop_timeout_s):
            self.killed = True
        self.exit_code = self.process.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.exit_code
