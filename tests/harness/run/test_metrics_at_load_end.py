"""metrics.parquet holds a counter's value at the end of the load, not a second before it.

The periodic scrapes (the /metrics scraper's and a real Prometheus') end up to one
interval before the load does; a run against vLLM once counted 45 fewer generated
tokens in ``vllm:generation_tokens_total``'s rise than its clients received. Both
sources are checked against a real HTTP ``/metrics`` (prometheus_client's exposition of
a real counter) and, for the second, Debian's ``prometheus``.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from harness.run.prometheus import PrometheusServer, find_prometheus
from harness.run.scrape import MetricsScraper


class Exposition:
    """A loopback ``/metrics`` serving one counter, ``tokens_total``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tokens = Counter("tokens", "tokens generated", registry=self.registry)
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Exposition:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _values(rows: list[tuple], name: str) -> list[float]:
    return [value for _, sample, _, value in rows if sample == name]


def test_the_scraper_scrapes_once_more_when_stopped():
    with Exposition() as exposition:
        # one scrape a minute: only the one at start happens before the stop
        scraper = MetricsScraper(f"http://{exposition.host}", interval_s=60.0).start()
        deadline = time.monotonic() + 10
        while scraper.scrapes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scraper.scrapes == 1
        exposition.tokens.inc(45)  # the load's last tokens, after the last periodic scrape
        scraper.stop()
        assert _values(scraper.rows, "tokens_total") == [0.0, 45.0]
        assert scraper.scrapes == 2
        scraper.stop()  # the cell's exit stack stops it again: no third scrape
        assert scraper.scrapes == 2


def test_a_scraper_stopped_before_it_ran_still_scrapes_once():
    with Exposition() as exposition:
        exposition.tokens.inc(3)
        scraper = MetricsScraper(f"http://{exposition.host}")
        scraper.stop()
        assert _values(scraper.rows, "tokens_total") == [3.0]


@pytest.mark.prometheus
def test_prometheus_waits_for_a_scrape_after_the_load():
    if find_prometheus() is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("Debian's prometheus is required in CI (make test installs it)")
        pytest.skip("prometheus is not installed (make test installs it)")
    with Exposition() as exposition, PrometheusServer([exposition.host]) as prom:
        exposition.tokens.inc(45)
        load_end = time.time()
        assert prom.wait_for_scrape(load_end)
        # the value at load end is in what Prometheus holds now
        [sample] = prom.query("tokens_total")
        assert float(sample["value"][1]) == 45.0
        # a scrape that cannot have happened yet is given up on: False, not a hang
        assert not prom.wait_for_scrape(time.time() + 3600, timeout_s=0.5)
