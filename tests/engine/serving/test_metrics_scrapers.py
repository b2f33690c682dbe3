"""/metrics cannot freeze generation: however many scrapers hammer it, the engine
renders the exposition at most once per ``METRICS_INTERVAL_S`` while it works (the API
process answers every scrape from the latest rendering) and keeps stepping. A real
``schedscope serve --executor sim`` subprocess, scraped from threads of this one."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from engine.serving.async_engine import (
    METRICS_IDLE_REFRESH_S,
    METRICS_INTERVAL_S,
    METRICS_UNWANTED_AFTER_S,
)
from harness.serve.local_server import CliServer, HttpClient
from tests.support.background_load import BackgroundLoad
from tests.support.served import health

NUM_SCRAPERS = 20
NUM_STREAMS = 8
WINDOW_S = 3.0
BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 200, "ignore_eos": True}


def scrape_in_loop(url: str, stop: threading.Event, answers: list[int], accept: str) -> None:
    client = HttpClient(url, timeout=30)
    headers = {"Accept": accept} if accept else {}
    while not stop.is_set():
        status, _, body = client.request("GET", "/metrics", headers=headers)
        answers.append(status)
        assert status != 200 or b"vllm:num_requests_running" in body
    client.close()


def window(url: str, seconds: float) -> tuple[int, int, float]:
    """(steps, renders, elapsed) over ``seconds``, from /health."""
    (status_before, before), started = health(url), time.monotonic()
    time.sleep(seconds)
    (status_after, after), elapsed = health(url), time.monotonic() - started
    assert status_before == status_after == 200
    return (
        after["num_steps"] - before["num_steps"],
        after["num_metrics_renders"] - before["num_metrics_renders"],
        elapsed,
    )


@pytest.mark.slow
@pytest.mark.parametrize("core", ["process", "thread"])
def test_many_scrapers_neither_stall_the_engine_nor_make_it_render_more(core, tmp_path):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"step_overhead_s": 0.02}))  # ~50 steps/s, mostly asleep
    args = ["--executor", "sim", "--cost-model", str(cost), "--engine-core", core]
    with (
        CliServer(args) as server,
        BackgroundLoad(server.url, NUM_STREAMS, lambda thread, n: (BODY, {})) as load,
    ):
        url = server.url
        time.sleep(1.0)  # the streams are running
        quiet_steps, _, quiet_s = window(url, WINDOW_S)
        assert quiet_steps > 0
        stop, answers = threading.Event(), []
        scrapers = [
            threading.Thread(
                target=scrape_in_loop,
                # both formats: each is rendered at most once per interval
                args=(url, stop, answers, "application/openmetrics-text" if i % 2 else ""),
                daemon=True,
            )
            for i in range(NUM_SCRAPERS)
        ]
        for thread in scrapers:
            thread.start()
        try:
            time.sleep(0.5)  # every scraper is in its loop
            busy_steps, renders, busy_s = window(url, WINDOW_S)
        finally:
            stop.set()
            for thread in scrapers:
                thread.join(30)
        scraped = len(answers)
        assert answers and set(answers) == {200}, sorted(set(answers))
        assert set(load.statuses) <= {200}
    # The count: renders follow the interval (both formats in one rendering in process
    # mode, one per format in thread mode), not the hundreds of scrapes answered.
    per_interval = 1 if core == "process" else 2
    assert renders <= per_interval * (busy_s / METRICS_INTERVAL_S + 2), (renders, scraped)
    assert scraped >= 10 * max(renders, 1), (renders, scraped)
    # The effect: the engine was not frozen while scraped (rendering on every scrape gave
    # 0 steps in this window). How much throughput scraping costs is a figure, not a
    # pass/fail: benchmarks/bench_metrics_scrapers.py prints it.
    assert busy_steps > 0, (busy_steps, quiet_steps, quiet_s)


def generation_tokens(url: str, accept: str) -> float:
    """``vllm:generation_tokens_total`` as one scrape of ``/metrics`` reports it."""
    client = HttpClient(url)
    try:
        headers = {"Accept": accept} if accept else {}
        status, _, body = client.request("GET", "/metrics", headers=headers)
    finally:
        client.close()
    assert status == 200, body[:200]
    match = re.search(rb"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", body, re.MULTILINE)
    assert match, body[:500]
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("core", ["process", "thread"])
def test_an_engine_nobody_scrapes_any_more_stops_rendering(core, tmp_path):
    """Scraped a few times, then not at all while it keeps working for longer than
    ``METRICS_UNWANTED_AFTER_S``: the renders stop (one more at most, as the window
    closes). A scrape after that gets fresh bytes, not the ones left from before."""
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"step_overhead_s": 0.02}))
    args = ["--executor", "sim", "--cost-model", str(cost), "--engine-core", core]
    formats = ("", "application/openmetrics-text")
    with (
        CliServer(args) as server,
        BackgroundLoad(server.url, NUM_STREAMS, lambda thread, n: (BODY, {})) as load,
    ):
        url = server.url
        time.sleep(0.5)  # the streams are running
        before = {}
        for _ in range(3):
            for accept in formats:
                before[accept] = generation_tokens(url, accept)
            time.sleep(0.5)
        # nobody scrapes from here on; the engine keeps working
        time.sleep(METRICS_UNWANTED_AFTER_S + 2 * METRICS_INTERVAL_S)
        steps, renders, elapsed = window(url, 3 * METRICS_INTERVAL_S)
        assert steps > 0
        # The old rule rendered once per interval for good: ~3 here.
        assert renders <= 1, (renders, elapsed)
        for accept in formats:  # rendered again when scraped again, and fresh
            assert generation_tokens(url, accept) > before[accept]
        assert set(load.statuses) <= {200}


class _FakeMetrics:
    def __init__(self) -> None:
        self.renders: list[str | None] = []

    def render(self, accept: str | None) -> tuple[bytes, str]:
        self.renders.append(accept)
        return b"x", str(accept)


def test_the_engine_renders_on_its_own_schedule_not_the_scrapers():
    """The engine process's policy: the formats asked for, at most once per interval
    while it works, once as it goes idle after steps, then only every idle refresh."""
    from engine.serving import engine_core

    now = [100.0]
    sent: list = []
    metrics = _FakeMetrics()
    publisher = engine_core._MetricsPublisher(metrics, sent.append, clock=lambda: now[0])
    publisher.publish_if_due(1, idle=False)
    assert sent == []  # nothing asked for: nothing rendered
    for _ in range(100):  # however often a format is asked for: once
        publisher.want("text")
    publisher.publish_if_due(1, idle=False)
    assert len(sent) == 1 and sent[0][:2] == ("metrics", 1)
    assert sent[0][3] == {"text": (b"x", "None")}
    for step in range(2, 50):  # busy, many steps within one interval: no render
        now[0] += METRICS_INTERVAL_S / 100
        publisher.publish_if_due(step, idle=False)
    assert len(sent) == 1
    now[0] += METRICS_INTERVAL_S
    publisher.publish_if_due(50, idle=False)
    assert len(sent) == 2 and sent[-1][1] == 50
    publisher.publish_if_due(51, idle=False)
    assert len(sent) == 2
    publisher.publish_if_due(51, idle=True)  # gone idle after a step: at once
    assert len(sent) == 3 and sent[-1][1] == 51
    for _ in range(40):  # idle, nothing new: only the idle refresh
        now[0] += 0.1
        publisher.publish_if_due(51, idle=True)
    assert len(sent) == 3
    now[0] += METRICS_IDLE_REFRESH_S
    publisher.publish_if_due(51, idle=True)
    assert len(sent) == 4
    publisher.want("openmetrics")  # a new format: both, at once
    publisher.publish_if_due(51, idle=True)
    assert set(sent[-1][3]) == {"text", "openmetrics"} and sent[-1][2] == 5
    publisher.want("bogus")
    assert publisher.formats == ["text", "openmetrics"]


def test_a_format_not_asked_for_within_the_window_is_no_longer_rendered():
    """Each scrape's "still wanted" keeps a format rendered; one not asked for within
    ``METRICS_UNWANTED_AFTER_S`` is dropped (and the API process told), and renders
    stop; asked for again, it is rendered at once, as a new format is."""
    from engine.serving import engine_core

    now = [0.0]
    sent: list = []
    publisher = engine_core._MetricsPublisher(_FakeMetrics(), sent.append, clock=lambda: now[0])
    publisher.want("text")
    publisher.want("openmetrics")
    step = 0

    def work(seconds: float) -> None:  # the engine steps every 10 ms
        nonlocal step
        for _ in range(round(seconds / 0.01)):
            now[0] += 0.01
            step += 1
            publisher.publish_if_due(step, idle=False)

    def renders() -> list:
        return [m for m in sent if m[0] == "metrics"]

    for _ in range(30):  # scraped (text only) once a second, for longer than the window
        work(1.0)
        publisher.want("text")
    assert publisher.formats == ["text"]
    assert [m for m in sent if m[0] == "metrics_unwanted"] == [
        ("metrics_unwanted", ["openmetrics"])
    ]
    assert set(renders()[-1][3]) == {"text"}
    assert 29 <= len(renders()) <= 32
    count = len(renders())
    work(METRICS_UNWANTED_AFTER_S + 5)  # nobody scrapes: renders stop, then none at all
    assert publisher.formats == [] and sent[-1] == ("metrics_unwanted", ["text"])
    assert len(renders()) <= count + METRICS_UNWANTED_AFTER_S / METRICS_INTERVAL_S + 1
    count = len(renders())
    work(30.0)
    publisher.publish_if_due(step, idle=True)
    assert len(renders()) == count
    publisher.want("text")  # scraped again: at once
    publisher.publish_if_due(step, idle=False)
    assert len(renders()) == count + 1 and set(renders()[-1][3]) == {"text"}
