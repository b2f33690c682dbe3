"""The Prometheus wrapper says why its targets are not up: each target's health and
last scrape error, so a failure on a slow CI machine tells a dead target from a slow one.
Debian's ``prometheus`` scrapes a loopback port that nothing listens on."""

from __future__ import annotations

import pytest

from harness.run.prometheus import PrometheusError, PrometheusServer, find_prometheus
from tests.support.components import missing
from tests.support.ports import free_port

pytestmark = [pytest.mark.prometheus]


def test_a_target_never_up_is_named_with_its_scrape_error():
    if find_prometheus() is None:
        missing("Debian's prometheus", "apt-get install -y --no-install-recommends prometheus")
    target = f"127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError) as raised:
        with PrometheusServer([target], scrape_interval_s=0.5, start_timeout_s=8):
            pass
    message = str(raised.value)
    assert f"http://{target}/metrics: down (" in message, message
    assert "connection refused" in message, message


def test_a_fractional_scrape_interval_is_a_valid_prometheus_duration():
    """Prometheus refuses "0.5s" (it exited with 2 on such a config; the test above runs
    one)."""
    server = PrometheusServer(["127.0.0.1:9"], scrape_interval_s=0.5)
    assert "scrape_interval: 500ms\n" in server.config_text()
