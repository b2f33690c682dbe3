"""Replaying an exact schedule against a served engine, open loop, and what the client
measured: the light asyncio client of ``benchmarks/bench_serving.py --client replay``
(``schedscope calibrate`` and bench_serving's default drive with Locust instead, the
load generator of ``schedscope run``: harness/run/loadgen.py ``drive_to_end``).

Every request is sent at its scheduled instant whatever the server is doing (open
loop), streams, carries its prompt as token ids (so the engine sees exactly the
scheduled prompt length) and asks for ``max_tokens`` with ``ignore_eos``, so the
engine generates exactly that many tokens. It asks for what ``schedscope run``'s load
generator asks for (:data:`REQUEST_FIELDS`: no ``temperature``, so the server's default
sampling): a client that asked for greedy decoding instead made every served step 16%
cheaper (its sampling 0.09 against 0.52 ms a step), and the two clients' steps could not
be compared. Latencies are counted from the scheduled
instant; the Unix times of the send and of the first token let the client's records
be joined with the engine's (:func:`client_latency`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl

from harness.loadgen.client import REQUEST_FIELDS
from harness.profiles import RequestSpec
from harness.records.percentiles import percentile
from harness.records.polars_types import as_float

#: Seconds between starting the client and the schedule's t=0 (time to open sessions).
START_DELAY_S = 0.5


class ReplayError(RuntimeError):
    """The server refused or broke a request of the schedule; the message says which."""


def prompt_ids(spec: RequestSpec, vocab_size: int) -> list[int]:
    """The request's prompt: ``spec.prompt_tokens`` token ids, deterministic per request,
    avoiding the first three ids (special tokens). The first two spell the request's
    index in base ``vocab_size - 3``, so no two requests of a schedule share a prefix
    (a prefix cache finds nothing), up to ``(vocab_size - 3)**2`` requests."""
    span = vocab_size - 3
    ids = [3 + (spec.index * 7919 + i * 104729) % span for i in range(spec.prompt_tokens)]
    lead = [3 + spec.index % span, 3 + (spec.index // span) % span][: len(ids)]
    ids[: len(lead)] = lead
    return ids


def _headers(spec: RequestSpec) -> dict[str, str]:
    headers = {"X-Request-Id": spec.request_id, "X-Request-Class": spec.class_name}
    if spec.turn is not None:  # a session turn's (the engine's hit rate by turn)
        headers["X-Session-Turn"] = str(spec.turn)
    return headers


async def replay(
    url: str,
    specs: list[RequestSpec],
    vocab: int,
    model: str = "tiny",
    on_finished: Callable[[dict], object] | None = None,
) -> tuple[list[dict], float]:
    """Send every spec at ``START_DELAY_S + scheduled_at`` and read its stream.

    Returns (one row per request: request_id, class, output_tokens, ttft_s, e2e_s,
    sent_unix, first_unix; the 99th percentile of how late the client sent, seconds).
    ``on_finished`` gets each row as its request ends (a progress bar). Raises
    :class:`ReplayError` when a request is not answered 200, and before sending anything
    when a spec is a session's turn or shares a prompt segment: this client sends
    single-turn prompts of their own (sessions, closed loop, and shared prefixes are
    sent by the load generator, ``schedscope run``), and must not drop them silently.
    """
    import aiohttp

    for spec in specs:
        if spec.session_id is not None or spec.shared:
            what = "a session's turn" if spec.session_id is not None else "a shared prefix"
            raise ReplayError(
                f"request {spec.request_id} has {what}: the replay client sends single-turn "
                "prompts of their own; send this schedule with schedscope run (Locust)"
            )

    rows: list[dict] = []
    lags: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + START_DELAY_S

        async def one(spec: RequestSpec) -> None:
            scheduled = start + spec.open_at
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            lags.append(loop.time() - scheduled)
            body = {
                **REQUEST_FIELDS,
                "model": model,
                "prompt": prompt_ids(spec, vocab),
                "max_tokens": spec.max_tokens,
                "min_tokens": spec.max_tokens,
                "priority": spec.priority,
            }
            first = last = None
            first_unix = None
            tokens = 0
            sent_unix = time.time()
            async with session.post(
                url + "/v1/completions",
                json=body,
                headers=_headers(spec),
            ) as response:
                if response.status != 200:
                    raise ReplayError(
                        f"request {spec.request_id} ({spec.prompt_tokens} prompt tokens, "
                        f"max_tokens {spec.max_tokens}): HTTP {response.status}: "
                        f"{await response.text()}"
                    )
                async for line in response.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                    if event.get("choices") and event["choices"][0].get("text"):
                        last = loop.time()
                        if first is None:
                            first, first_unix = last, time.time()
            if first is None or last is None:
                raise ReplayError(f"request {spec.request_id}: the stream carried no token")
            row = {
                "request_id": spec.request_id,
                "class": spec.class_name,
                "output_tokens": tokens,
                "ttft_s": first - scheduled,
                "e2e_s": last - scheduled,
                "sent_unix": sent_unix,
                "first_unix": first_unix,
            }
            rows.append(row)
            if on_finished is not None:
                on_finished(row)

        await asyncio.gather(*(one(s) for s in specs))
    return rows, (percentile(lags, 99) or 0.0)


def client_latency(
    client: pl.DataFrame, engine_requests: Path, clock_epoch_unix: float
) -> dict | None:
    """Median time a request and its tokens spend outside the engine: from the client's
    send to the engine's arrival stamp (intake), and from the engine's first token to
    the client's (delivery), joined by request id through the engine's clock epoch
    (``/health``'s ``clock_epoch_unix``). ``engine_requests``: the server's
    ``--record-requests`` file; None when it is missing or no row joins."""
    if not engine_requests.exists():
        return None
    engine = pl.read_parquet(engine_requests).select(
        "request_id",
        (pl.col("scheduled_at") + clock_epoch_unix).alias("arrival_unix"),
        (pl.col("first_token_at") + clock_epoch_unix).alias("engine_first_unix"),
    )
    joined = (
        client.join(engine, on="request_id")
        .select(
            (pl.col("arrival_unix") - pl.col("sent_unix")).alias("intake_s"),
            (pl.col("first_unix") - pl.col("engine_first_unix")).alias("delivery_s"),
        )
        .drop_nulls()
    )
    if joined.height == 0:
        return None
    return {
        "intake_s": as_float(joined["intake_s"].median()),
        "delivery_s": as_float(joined["delivery_s"].median()),
        "client_latency_s": as_float((joined["intake_s"] + joined["delivery_s"]).median()),
        "joined": joined.height,
    }
