"""A real Prometheus (Debian's ``prometheus``) scrapes the real vLLM under load. Every
panel query of schedscope's dashboards (``harness.grafana.dashboards.panel_queries``), and of
vLLM's own published dashboard (tests/data/vllm_grafana_queries.txt), whose metric
names vLLM V1 exposes returns data. The others need the bundled engine: schedscope's own
``schedscope_*`` families, or vLLM V0 names that V1 dropped; they are listed (printed,
and checked to be exactly of those two kinds; docs/vllm.md lists them)."""

from __future__ import annotations

import re
import time

import pytest

from harness.grafana.dashboards import panel_queries, substitute
from harness.run.prometheus import PrometheusServer, find_prometheus
from tests.support.background_load import BackgroundLoad
from tests.support.components import missing
from tests.support.paths import DATA
from tests.support.prometheus_results import has_data
from tests.support.vllm_server import SERVED_MODEL_NAME
from tests.vllm.test_vllm_metric_names import ONLY_BUNDLED

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NAMES = re.compile(r"\b(vllm:[a-z0-9_:]+|schedscope_[a-z0-9_]+)")


def _request(thread: int, n: int) -> tuple[dict, dict[str, str]]:
    """Streaming completions of three lengths from six threads (more than vLLM's four
    running slots: a queue forms)."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": "the of and to in is that for it as " * (1 + (n + 1) % 5),
        "max_tokens": 40 + 60 * ((n + 1) % 3),
        "ignore_eos": True,
        "stream": True,
    }
    return body, {}


@pytest.fixture(scope="module")
def scraped(vllm_server):
    if find_prometheus() is None:
        missing("Debian's prometheus", "apt-get install -y --no-install-recommends prometheus")
    exposed = {
        line.split("{")[0].split(" ")[0]
        for line in vllm_server.get("/metrics").decode().splitlines()
        if line and not line.startswith("#")
    }
    target = vllm_server.url.removeprefix("http://")
    # Prometheus first, the load second: its first scrape meets an idle vLLM. Under load a
    # slow 2-core machine's vLLM once answered no scrape within the 1-s interval (and so
    # the 1-s timeout) for 30 s; 2 s each leaves it room, and a missed scrape is a gap.
    with (
        PrometheusServer([target], scrape_interval_s=2.0) as prometheus,
        BackgroundLoad(vllm_server.url, 6, _request, timeout_s=30) as load,
    ):
        time.sleep(12)  # several scrapes under load: rate() windows have data
        yield prometheus, exposed
    assert load.statuses and set(load.statuses) == {200}, set(load.statuses)


def check(prometheus, exposed: set[str], queries: list[tuple[str, str]]) -> list[str]:
    """Queries on vLLM's names that return no data (the failures); prints the others.

    A query is on vLLM's names when it uses no ``schedscope_*`` name and at least one
    name vLLM V1 exposes (the dashboards' ``(V1) or (V0)`` fallbacks count: V1's side
    answers)."""
    empty, engine_only = [], []
    for where, expr in queries:
        names = set(NAMES.findall(expr))
        ours = {n for n in names if n.startswith("schedscope_")}
        if ours or not names & exposed:
            others = sorted(names - exposed)
            unexpected = [n for n in others if n not in ours and not _v0_name(n)]
            assert not unexpected, f"{where}: {unexpected} are neither schedscope's nor V0's"
            engine_only.append(f"{where}: {', '.join(others)}")
        elif not has_data(prometheus.query(expr)):
            empty.append(f"{where}: {expr}")
    print("need the bundled engine (schedscope_* or vLLM V0 names):\n" + "\n".join(engine_only))
    return empty


def _v0_name(sample_name: str) -> bool:
    return any(sample_name.startswith(family) for family in ONLY_BUNDLED)


def test_every_dashboard_panel_on_vllms_names_returns_data_from_vllm(scraped):
    prometheus, exposed = scraped
    queries = [
        (f"{q.dashboard_uid} / {q.panel_title} [{q.ref_id}]", q.expr)
        for q in panel_queries({"model_name": SERVED_MODEL_NAME})
    ]
    empty = check(prometheus, exposed, queries)
    assert not empty, "panels without data:\n" + "\n".join(empty)
    on_vllm = [
        q for q in queries if "schedscope_" not in q[1] and set(NAMES.findall(q[1])) & exposed
    ]
    assert len(on_vllm) >= 10, on_vllm


def test_vllms_published_dashboard_returns_data_on_its_v1_names(scraped):
    prometheus, exposed = scraped
    lines = (DATA / "vllm_grafana_queries.txt").read_text().splitlines()
    queries = [
        (
            "vLLM dashboard",
            substitute(x, {"model_name": SERVED_MODEL_NAME, "__rate_interval": "1m"}),
        )
        for x in lines
        if x.strip() and not x.startswith("#")
    ]
    empty = check(prometheus, exposed, queries)
    assert not empty, "vLLM dashboard queries without data:\n" + "\n".join(empty)
