"""A real Prometheus (Debian's ``prometheus`` binary) scraping given targets, for tests
and for runs that want one (``schedscope run --prometheus``).

Started on 127.0.0.1 with a free port, its data in a directory of ours, exemplar
storage on; stopped (SIGTERM, then SIGKILL) by the process id we started. Queries use
the HTTP API (``/api/v1/query``, ``/api/v1/query_exemplars``, ``/api/v1/targets``).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from harness.processes.stop import stop_process

PROMETHEUS_BINARY = "prometheus"


class PrometheusError(RuntimeError):
    pass


def find_prometheus() -> str | None:
    """The path of the ``prometheus`` binary, or None."""
    return shutil.which(PROMETHEUS_BINARY)


def target_states(active: list[dict]) -> str:
    """Each active target's health and last scrape error, as Prometheus's targets API
    reports them ("none discovered yet" before the first discovery)."""
    if not active:
        return "none discovered yet"
    return "; ".join(
        f"{t.get('scrapeUrl', '?')}: {t.get('health', '?')}"
        + (f" ({t['lastError']})" if t.get("lastError") else "")
        for t in active
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrometheusServer:
    """``with PrometheusServer(["127.0.0.1:8000"]) as prom: prom.query("up")``.

    ``targets`` are ``host:port`` scraped at ``/metrics`` every ``scrape_interval_s``.
    ``__enter__`` returns once every target has been scraped successfully (Prometheus
    throttles target discovery: the first sample lands ~5 s after start)."""

    def __init__(
        self,
        targets: list[str],
        scrape_interval_s: float = 1.0,
        data_dir: Path | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.targets = targets
        self.scrape_interval_s = scrape_interval_s
        self.start_timeout_s = start_timeout_s
        self._own_dir = data_dir is None
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="schedscope-prometheus-"))
        self.process: subprocess.Popen | None = None
        self.url = ""

    def config_text(self) -> str:
        # Prometheus durations take no fractions ("0.5s" is refused): milliseconds do.
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        targets = ", ".join(json.dumps(t) for t in self.targets)
        return (
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            f"scrape_configs:\n  - job_name: schedscope\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{targets}]\n"
        )

    def __enter__(self) -> PrometheusServer:
        binary = find_prometheus()
        if binary is None:
            raise PrometheusError(
                "the prometheus binary is not installed (Debian: apt-get "
                "install -y --no-install-recommends prometheus)"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(self.config_text())
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = (self.dir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--enable-feature=exemplar-storage",
                "--storage.tsdb.retention.time=1d",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_for_targets()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_for_targets(self) -> None:
        process = self.process
        assert process is not None, "called by __enter__, after the Popen"
        deadline = time.monotonic() + self.start_timeout_s
        active: list[dict] = []
        while True:
            if process.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {process.returncode}:\n{self.log_tail()}"
                )
            try:
                active = self.api("/api/v1/targets")["activeTargets"]
                if active and all(t["health"] == "up" for t in active):
                    return
            except (OSError, PrometheusError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"targets not up within {self.start_timeout_s:g} s "
                    f"({target_states(active)}):\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        path = self.dir / "prometheus.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer: JSON whose shape is the endpoint's (an object for
        ``/api/v1/targets`` and ``/api/v1/query``, an array for ``query_exemplars``)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector (``[{"metric": {...}, "value": [t, "v"]}]``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("/api/v1/query", **params)
        return data["result"] if isinstance(data, dict) else data

    def wait_for_scrape(self, after: float, timeout_s: float = 5.0) -> bool:
        """Wait until every target has been scraped at or after ``after`` (Unix s), so
        that a counter's last sample holds what happened before then; False if that
        did not happen within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                scraped = [float(row["value"][1]) for row in self.query("timestamp(up)")]
            except (OSError, PrometheusError):
                scraped = []
            if scraped and min(scraped) >= after:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict]:
        return self.api(
            "/api/v1/query_exemplars", query=expr, start=f"{start:.3f}", end=f"{end:.3f}"
        )

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            stop_process(self.process, 10.0)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
