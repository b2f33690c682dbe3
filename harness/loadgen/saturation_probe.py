"""A target's capacity on a profile's mix, measured: a short, bounded saturation probe
(``schedscope run --target URL --rate-scale auto``; harness/profiles/rate_scale.py).

What it sends: ``streams`` closed loops, each sending the profile's requests (its mix of
classes, prompt and output lengths, sampled with the run's seed) back to back, streamed,
as the load generator sends them (:class:`~harness.loadgen.client.OpenAIClient`, the
same prompts, model and API key). For ``warmup_s`` the target's batch fills; then for
``measure_s`` the requests that end are counted: the capacity is their number over that
time. Then no request is sent any more and those in flight are let finish — at most
``drain_s``, so the first cell does not start on a target still busy with the probe.
Every bound is printed with the result.

It measures what ``streams`` concurrent requests get out of the target: a target that
batches more than ``streams`` at once is under-loaded by the probe, and the capacity is
a lower bound (the line says how many streams). Failed requests are not capacity: a
probe in which fewer than half of the ended requests succeeded, or none ended in the
window, fails with the reason.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.loadgen.client import OpenAIClient, RequestsTransport, probe
from harness.loadgen.prompts import DEFAULT_ID_RANGE
from harness.profiles import Profile, RequestSpec, sample_requests
from harness.profiles.rate_scale import Capacity

STREAMS = 64
WARMUP_S = 10.0
MEASURE_S = 20.0
DRAIN_S = 60.0
#: Requests sampled from the mix; the loops take them in turn, and cycle if they run out.
SAMPLE = 4000


class ProbeError(RuntimeError):
    """The probe could not measure a capacity (the reason is the message)."""


@dataclass
class _Tally:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def probe_capacity(
    url: str,
    profile: Profile,
    *,
    endpoint: str = "completions",
    model: str = "",
    api_key: str = "",
    prompt_mode: str = "auto",
    seed: int | None = None,
    streams: int = STREAMS,
    warmup_s: float = WARMUP_S,
    measure_s: float = MEASURE_S,
    drain_s: float = DRAIN_S,
    timeout_s: float = 120.0,
    model_flag: str = "--model",
) -> Capacity:
    """The target's capacity on ``profile``'s mix (module docstring). ``ProbeError`` when
    it cannot be measured. ``model_flag``: the caller's option for the model name, which
    the error names when ``model`` is empty and the target's /v1/models names none."""
    first = RequestsTransport(url, 4, timeout_s)
    try:
        info, sizer = probe(
            first,
            endpoint=endpoint,
            model=model,
            api_key=api_key,
            prompt_mode=prompt_mode,
            continuous="off",
            model_flag=model_flag,
        )
    except RuntimeError as exc:
        raise ProbeError(str(exc)) from None
    finally:
        first.close()
    prompts = info.prompts
    assert prompts is not None, "probe() always chooses the prompts"
    specs = sample_requests(profile, SAMPLE, seed)
    turn = _turns(specs)
    turn_lock = threading.Lock()
    stop = threading.Event()
    start = time.monotonic()
    window = (start + warmup_s, start + warmup_s + measure_s)
    tally = _Tally()

    def loop(index: int) -> None:
        transport = RequestsTransport(url, 1, timeout_s)
        client = OpenAIClient(
            transport,
            endpoint=endpoint,
            model=info.model,
            api_key=api_key,
            prompt_mode=prompts.mode,
            id_range=prompts.id_range or DEFAULT_ID_RANGE,
            continuous_usage=False,
            sizer=sizer,
            profile_name=profile.name,
            run_id="saturation-probe",
            worker=index,
        )
        try:
            while not stop.is_set():
                with turn_lock:
                    spec = next(turn)
                row = client.new_row(spec, "open", time.time(), False)
                try:
                    client.send(row, spec)
                except Exception as exc:  # noqa: BLE001 - a broken request is a failure
                    row["status"], row["error"] = "error", f"{type(exc).__name__}: {exc}"
                ended = time.monotonic()
                if window[0] <= ended <= window[1]:
                    with tally.lock:
                        if row["status"] == "ok":
                            tally.ok += 1
                        else:
                            tally.failed += 1
                            if len(tally.errors) < 3:
                                tally.errors.append(str(row.get("error")))
        finally:
            transport.close()

    threads = [
        threading.Thread(target=loop, args=(i,), daemon=True, name=f"probe-{i}")
        for i in range(streams)
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, window[1] - time.monotonic()))
    stop.set()
    drained_by = time.monotonic() + drain_s
    for thread in threads:
        thread.join(max(0.0, drained_by - time.monotonic()))
    still = sum(thread.is_alive() for thread in threads)
    if tally.ok == 0:
        why = f": {'; '.join(tally.errors)}" if tally.errors else ""
        raise ProbeError(
            f"no request of the probe succeeded in its {measure_s:g} s window "
            f"({tally.failed} failed{why})"
        )
    if tally.failed > tally.ok:
        raise ProbeError(
            f"{tally.failed} of the probe's {tally.ok + tally.failed} requests in its window "
            f"failed ({'; '.join(tally.errors)}): not a capacity"
        )
    how = (
        f"{streams} concurrent streams of its mix against the target for "
        f"{warmup_s:g} s + {measure_s:g} s: {tally.ok} completed in the last {measure_s:g} s"
        + (f", {tally.failed} failed" if tally.failed else "")
        + (f"; {still} still in flight after a {drain_s:g} s drain" if still else "")
        + f" (a lower bound if the target batches more than {streams})"
    )
    return Capacity(requests_per_s=tally.ok / measure_s, method="probe", how=how)


def _turns(specs: list[RequestSpec]) -> Iterator[RequestSpec]:
    """The sampled requests in order, cycled, each with a fresh id."""
    n = 0
    while True:
        for spec in specs:
            n += 1
            yield dataclasses.replace(spec, request_id=f"probe-{n}")
