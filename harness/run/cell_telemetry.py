"""A load cell's telemetry while its load runs: the metrics source (a real Prometheus
with --prometheus, else the /metrics scraper) that ends in metrics.parquet, and the
OTLP receivers that take a --target's spans into raw/target_spans.jsonl. Each starts
with its stop on the cell's ExitStack; what cannot start is a warning of the cell."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.run.cell_result import LoadCell
from harness.run.scrape import MetricsScraper, export_prometheus

if TYPE_CHECKING:
    from harness.run.otlp_receiver import SpanLines
    from harness.run.prometheus import PrometheusServer


#: With --prometheus, how long the cell waits for a scrape after the load (it scrapes
#: every second) before exporting, so the counters' last samples hold the whole load.
LAST_SCRAPE_WAIT_S = 5.0


@dataclass
class MetricsSource:
    """A cell's metrics source: a real Prometheus (``prom``, with --prometheus) or the
    /metrics ``scraper``. Both feed the live view and end in metrics.parquet."""

    scraper: MetricsScraper
    prom: PrometheusServer | None = None

    def latest(self) -> dict[str, float]:
        """The live view's queue depths, from whichever source runs."""
        return _prom_latest(self.prom) if self.prom is not None else self.scraper.latest


def start_metrics(stack: ExitStack, run: LoadCell, url: str) -> MetricsSource:
    """Start the metrics source of the cell, its stop on ``stack``: with --prometheus a
    real Prometheus scraping ``url``, falling back (with a warning) to the /metrics
    scraper when it cannot start; else the scraper."""
    settings = run.settings
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    metrics = MetricsSource(MetricsScraper(url, headers=headers))
    if settings.prometheus:
        metrics.prom = _start_prometheus(stack, run, url)
    if metrics.prom is None:
        metrics.scraper.start()
        stack.callback(metrics.scraper.stop)
    return metrics


def _start_prometheus(stack: ExitStack, run: LoadCell, url: str) -> PrometheusServer | None:
    """A real Prometheus scraping ``url`` every second, on ``stack``; None (with the
    cell's warning) when it cannot start."""
    from harness.run.prometheus import PrometheusError, PrometheusServer

    host = url.split("://", 1)[-1].rstrip("/")
    try:
        prom = stack.enter_context(
            PrometheusServer([host], scrape_interval_s=1.0, data_dir=run.cell_dir / "prometheus")
        )
    except PrometheusError as exc:
        run.result.warnings.append(f"--prometheus: {exc}; scraping /metrics directly instead")
        return None
    run.info["prometheus_url"] = prom.url
    return prom


def start_otlp_receiver(stack: ExitStack, run: LoadCell) -> SpanLines | None:
    """For a --target cell with --target-otlp-port and/or --target-otlp-grpc-port:
    receive the target's spans (OTLP/HTTP, OTLP/gRPC or both, into one trace file,
    raw/target_spans.jsonl) until ``stack`` closes. Returns the trace file's writer
    (its span count), or None for any other cell or (each with the cell's warning) when
    no port can be served."""
    settings = run.settings
    http_port, grpc_port = settings.target_otlp_port, settings.target_otlp_grpc_port
    if run.result.mode != "target" or (http_port is None and grpc_port is None):
        return None
    from harness.run.otlp_receiver import OtlpReceiver, SpanLines

    lines = stack.enter_context(SpanLines(target_trace(run.raw)))
    receiving = False
    if http_port is not None:
        try:
            receiver = stack.enter_context(OtlpReceiver(lines, http_port))
        except OSError as exc:
            run.result.warnings.append(f"--target-otlp-port: {exc}; no spans over OTLP/HTTP")
        else:
            receiving = True
            run.info["otlp_receiver"] = receiver.url
            run.show(f"{run.cell.name}: receiving the target's spans at {receiver.url}")
    if grpc_port is not None:
        from harness.run.otlp_grpc_receiver import OtlpGrpcReceiver

        try:
            grpc_receiver = stack.enter_context(OtlpGrpcReceiver(lines, grpc_port))
        except OSError as exc:
            run.result.warnings.append(f"--target-otlp-grpc-port: {exc}; no spans over OTLP/gRPC")
        else:
            receiving = True
            run.info["otlp_grpc_receiver"] = grpc_receiver.url
            run.show(
                f"{run.cell.name}: receiving the target's spans over OTLP/gRPC at "
                f"{grpc_receiver.url}"
            )
    return lines if receiving else None


def target_trace(raw: Path) -> Path:
    """The trace file a --target cell's OTLP receivers write."""
    return raw / "target_spans.jsonl"


def stop_metrics(metrics: MetricsSource, run: LoadCell, load_start: float) -> None:
    """metrics.parquet of the load: Prometheus' series from ``load_start`` on (exported
    while it still runs, once it has scraped after the load; a failed export degrades
    the cell), else the scraper's rows once it has stopped (its last scrape after the
    load), with its scrape count and failures."""
    path = run.cell_dir / "metrics.parquet"
    if metrics.prom is not None:
        if not metrics.prom.wait_for_scrape(time.time(), LAST_SCRAPE_WAIT_S):
            run.result.warnings.append(
                "Prometheus did not scrape the target after the load within "
                f"{LAST_SCRAPE_WAIT_S:g} s: metrics.parquet may miss the load's last second"
            )
        try:
            frame = export_prometheus(metrics.prom, load_start - 1, time.time() + 1)
            frame.write_parquet(path)
        except Exception as exc:  # noqa: BLE001 - keep the rest of the cell
            run.result.fail("prometheus_export", f"{type(exc).__name__}: {exc}")
        return
    scraper = metrics.scraper
    scraper.stop()
    scraper.write(path)
    run.info["scrapes"] = scraper.scrapes
    if scraper.failures:
        run.result.warnings.append(
            f"{scraper.failures} of {scraper.scrapes + scraper.failures} "
            f"/metrics scrapes failed (last: {scraper.last_error})"
        )


def _prom_latest(prom) -> dict[str, float]:
    out = {}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        try:
            values = prom.query(f"sum({name})")
            if values:
                out[name] = float(values[0]["value"][1])
        except Exception:  # noqa: BLE001 - a live figure only
            pass
    return out
