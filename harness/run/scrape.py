"""``/metrics`` into ``metrics.parquet``: one row per sample per scrape.

Columns: ``timestamp`` (Unix s of the scrape, float), ``name`` (the sample name, e.g.
``vllm:num_requests_waiting``, ``vllm:time_to_first_token_seconds_bucket``), ``labels``
(a JSON object string with sorted keys, e.g. ``{"engine": "0", "le": "0.5",
"model_name": "tiny"}``: one type whatever the target's label names), ``value``
(float). ``*_created`` samples are dropped. Parsed with prometheus_client's text
parser, so vLLM's and schedscope's names alike; nothing assumes ``schedscope_`` names.

:class:`MetricsScraper` scrapes every second on a thread (and keeps the latest queue
depths for the live view), and once more when stopped, after the load;
:func:`export_prometheus` reads a real Prometheus' series back for ``--prometheus`` runs.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import polars as pl
from prometheus_client.parser import text_string_to_metric_families

METRICS_SCHEMA = {
    "timestamp": pl.Float64,
    "name": pl.String,
    "labels": pl.String,
    "value": pl.Float64,
}
#: Live-view gauges (vLLM names; the first present wins).
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"


def parse_exposition(text: str, timestamp: float) -> list[tuple]:
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            rows.append(
                (
                    timestamp,
                    sample.name,
                    json.dumps(sample.labels, sort_keys=True),
                    float(sample.value),
                )
            )
    return rows


def metrics_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=METRICS_SCHEMA, orient="row")


class MetricsScraper:
    def __init__(self, url: str, interval_s: float = 1.0, headers: dict | None = None) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.headers = headers or {}
        self.rows: list[tuple] = []
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self.latest: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="schedscope-scrape", daemon=True)
        self._lock = threading.Lock()

    def scrape_once(self) -> None:
        now = time.time()
        try:
            request = urllib.request.Request(self.url, headers=self.headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                text = response.read().decode("utf-8", errors="replace")
            rows = parse_exposition(text, now)
        except Exception as exc:  # noqa: BLE001 - a scrape may fail; count it, keep going
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        latest: dict[str, float] = {}
        for _, name, _, value in rows:
            if name in (WAITING, RUNNING):
                latest[name] = latest.get(name, 0.0) + value
        with self._lock:
            self.rows.extend(rows)
            self.latest = latest
            self.scrapes += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> MetricsScraper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then scrape once more: the periodic scrapes end up to one
        interval before the load does, and a counter's last value must hold all of it
        (a run's generated tokens are the counter's rise over the load)."""
        if self._stop.is_set():
            return  # stopped already: the cell's exit stack stops it again
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.scrape_once()

    def write(self, path: Path) -> int:
        with self._lock:
            frame = metrics_frame(self.rows)
        frame.write_parquet(path)
        return frame.height


def export_prometheus(prom, start: float, end: float, step_s: float = 1.0) -> pl.DataFrame:
    """Every series a real Prometheus scraped between ``start`` and ``end`` (Unix s), in
    the metrics.parquet schema (Prometheus' own ``job``/``instance`` labels dropped)."""
    data = prom.api(
        "/api/v1/query_range",
        query='{__name__=~".+"}',
        start=f"{start:.3f}",
        end=f"{end:.3f}",
        step=f"{step_s:g}s",
    )
    rows = []
    for series in data.get("result", []):
        labels = dict(series["metric"])
        name = labels.pop("__name__", "")
        if name.endswith("_created") or name in (
            "up",
            "scrape_duration_seconds",
            "scrape_samples_scraped",
            "scrape_samples_post_metric_relabeling",
            "scrape_series_added",
        ):
            continue
        labels.pop("job", None)
        labels.pop("instance", None)
        text = json.dumps(labels, sort_keys=True)
        rows += [(float(t), name, text, float(v)) for t, v in series["values"]]
    return metrics_frame(rows)
