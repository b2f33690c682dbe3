"""An exact schedule (a list of :class:`RequestSpec`) written as a profile that any
driver replays request for request: a plain-layout trace (``<name>.csv``: arrival,
prompt and output lengths, class) and a TOML profile with one trace phase over it
(``<name>.toml``, the classes given, for their priorities and SLOs).

This is how a schedule built in code (``schedscope calibrate``'s, a benchmark's cut of
a profile) reaches Locust, which runs files, with nothing redrawn: the Locust user sends
each request at its instant, its prompt length, and its output length as ``max_tokens``
with ``ignore_eos``. A trace phase starts at its first arrival, so the written schedule
is the given one moved earlier by the first request's ``scheduled_at``
(:func:`written_schedule` is what a driver of the file sends).
"""

from __future__ import annotations

import csv
from pathlib import Path

import tomli_w

from harness.profiles.errors import ProfileError
from harness.profiles.loader import load_profile
from harness.profiles.model import Phase, Profile, RequestClass
from harness.profiles.schedule import RequestSpec, build_plan
from harness.profiles.serialize import profile_to_dict
from harness.profiles.trace import ReplayTrace

#: The plain trace layout's columns, in the order written.
TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "class")


def write_schedule_profile(
    specs: list[RequestSpec],
    classes: tuple[RequestClass, ...],
    directory: Path,
    name: str,
    seed: int = 0,
    description: str = "",
) -> Path:
    """Write ``<name>.csv`` and ``<name>.toml`` into ``directory``; returns the TOML's
    path. ``specs``: open-loop requests (``scheduled_at`` set), each of a class named in
    ``classes``; their ``max_tokens`` must be their output length (a trace phase asks
    for exactly the trace's output)."""
    if not specs:
        raise ProfileError("schedule: no request to write")
    names = {c.name for c in classes}
    for spec in specs:
        if spec.scheduled_at is None:
            raise ProfileError(f"schedule: {spec.request_id} is closed-loop (no scheduled_at)")
        if spec.class_name not in names:
            raise ProfileError(
                f"schedule: {spec.request_id}'s class {spec.class_name!r} is not given"
            )
        if spec.max_tokens != spec.output_tokens:
            raise ProfileError(
                f"schedule: {spec.request_id} asks for max_tokens {spec.max_tokens} but "
                f"generates {spec.output_tokens}; a trace sends the output length"
            )
    directory.mkdir(parents=True, exist_ok=True)
    trace_file = directory / f"{name}.csv"
    ordered = sorted(specs, key=lambda s: (s.scheduled_at, s.index))
    with open(trace_file, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(TRACE_COLUMNS)
        for spec in ordered:
            # repr: the shortest text that reads back as the same float
            writer.writerow(
                (repr(spec.scheduled_at), spec.prompt_tokens, spec.output_tokens, spec.class_name)
            )
    profile = Profile(
        name=name,
        seed=seed,
        description=description,
        classes=classes,
        phases=(Phase(name=name, trace=ReplayTrace(file=str(trace_file), format="plain")),),
    )
    written = profile_to_dict(profile)
    # relative to the profile, so the two files can move together
    written["phases"][0]["trace"]["file"] = trace_file.name
    profile_file = directory / f"{name}.toml"
    profile_file.write_bytes(tomli_w.dumps(written).encode())
    return profile_file


def written_schedule(profile_file: Path) -> list[RequestSpec]:
    """The open-loop requests a driver of ``profile_file`` (as written by
    :func:`write_schedule_profile`) sends, in order."""
    return build_plan(load_profile(profile_file)).open_loop_requests()
