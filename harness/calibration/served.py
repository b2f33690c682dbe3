"""``schedscope calibrate``'s default method: fit the cost model from a served run made
for it, on this machine.

The simulator predicts served step cycles (a step's full cycle, serving overhead
included; ``engine.sim.cost_fit``), and those differ from machine to machine by more
than any fixed default can absorb. So calibration serves the engine here
(``schedscope serve --executor torch --record-steps --record-requests`` with the engine
knobs and torch threads given, a subprocess: :func:`serve_args`),
drives the *calibration schedule* against it request for request with the load
generator of ``schedscope run`` (Locust, :func:`harness.run.loadgen.drive_to_end`, the
schedule written as a trace profile), and fits the recorded step cycles
(:func:`fit_served_steps`), with ``client_latency_s`` from the client's records joined
with the engine's. The cycles of the steps that started while the load generator lagged
its schedule are left out (:mod:`harness.records.generator_limited`): a generator that
falls behind is busy on the engine's cores, and those steps price the two together.

Why Locust and not a lighter client: the simulator predicts ``schedscope run``, whose
load generator shares the machine with the engine. On 2 cores the engine's steps took
14-22% longer beside Locust than beside a light asyncio client for the same work
(docs/simulator.md), so a fit made under the light client was that optimistic for
every run.

The calibration schedule is a load profile built here (not a user-facing profile): one
phase per family of batch shapes the profiles produce, so the fit sees each of them —

- ``decode_heavy``: many running requests with short prompts and long outputs (large
  decode batches, no prefill);
- ``prefill_burst``: many long prompts arriving at once (steps full of prefill, up to
  the token budget);
- ``mixed``: a chat-like mix at a steady rate (prefill chunks beside decodes);
- ``long_context``: prompt + output near ``max_model_len`` (decodes over long
  contexts).

``quick`` is a phase of requests arriving mostly alone (small batches, prefills of
every size beside few decodes: what lets a short run's fit tell the prefill terms from
the mixed-step one) and one round of the four, about a minute on 2 cores; the full
schedule runs the round twice as long and then a light one at 0.3x the rates (small
batches): about 2.5 times the requests, under two minutes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import FEATURES, CostModel, CostModelError
from engine.factory import EXECUTORS
from harness.costmodel.fit import CalibrateInputError
from harness.processes.cpu_split import CpuSplit, split_of
from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    RequestClass,
    RequestSpec,
    build_plan,
)
from harness.serve.knobs import config_knobs, knob_defaults, knob_flags

if TYPE_CHECKING:
    import polars as pl

    from harness.costmodel.machine import Fingerprint

#: The shape families of the calibration schedule (its phases run long_context first).
SHAPE_FAMILIES = ("decode_heavy", "prefill_burst", "mixed", "long_context")
#: The calibration server's KV pool, in tokens: twice what the full schedule holds at
#: once on a slow machine.
KV_POOL_TOKENS = 1 << 17
#: A decode batch this large (and no prefill) is a decode-heavy step.
DECODE_HEAVY_SEQS = 32
#: A step with this many prefill tokens is part of a prefill burst.
PREFILL_BURST_TOKENS = 1024
#: A decode step whose mean context is at least this share of max_model_len is a
#: long-context step.
LONG_CONTEXT_SHARE = 0.5


#: ``schedscope calibrate --method`` values.
METHODS = ("served", "profile")
#: Stands for the served engine's knobs (every engine knob flag but --model and
#: --block-size, which every way that builds or profiles the model takes).
ENGINE_KNOBS = "engine knobs"
#: The method-specific flags each way of calibrating takes ("steps": --from-steps, which
#: ignores the profiling flags as it always has; its --executor and --torch-threads say
#: what ran the steps when nothing beside them records it).
_METHOD_FLAGS = {
    "served": (
        "--executor",
        "--cost-model",
        "--seed",
        "--records-dir",
        "--torch-threads",
        ENGINE_KNOBS,
    ),
    "profile": ("--device", "--repeats"),
    "steps": ("--device", "--repeats", "--executor", "--torch-threads"),
}


def resolve_method(
    method: str | None,
    from_steps: bool,
    given: dict[str, object],
    knobs: tuple[str, ...] | list[str] = (),
) -> str:
    """Which way ``schedscope calibrate`` fits: "served" (the default), "profile" or
    "steps" (``--from-steps``). ``given``: method-specific flag -> its value (None when
    not given); ``knobs``: the engine knob flags given (but --model and --block-size).
    A flag the chosen way does not take is refused, naming it."""
    if method is not None and method not in METHODS:
        raise CalibrateInputError(
            f"unknown method {method!r} (choose {' or '.join(METHODS)})", "--method"
        )
    if from_steps and method is not None:
        raise CalibrateInputError(
            "--from-steps fits the given step records; it takes no --method", "--method"
        )
    chosen = "steps" if from_steps else method or "served"
    way = "--from-steps" if chosen == "steps" else f"--method {chosen}"
    if method is None and chosen == "served":
        way += " (the default)"
    for flag, value in given.items():
        if value is not None and flag not in _METHOD_FLAGS[chosen]:
            raise CalibrateInputError(f"does not apply to {way}; only to {_takers(flag)}", flag)
    if knobs and ENGINE_KNOBS not in _METHOD_FLAGS[chosen]:
        raise CalibrateInputError(
            f"an engine knob of the served engine: does not apply to {way}; only to "
            f"{_takers(ENGINE_KNOBS)}",
            knobs[0],
        )
    return chosen


def _takers(flag: str) -> str:
    """The ways that take ``flag``, as words: "--method served or --from-steps"."""
    ways = [f"--method {m}" for m in METHODS if flag in _METHOD_FLAGS[m]]
    if flag in _METHOD_FLAGS["steps"]:
        ways.append("--from-steps")
    return " or ".join(ways)


class ServedCalibrationError(RuntimeError):
    """The served run did not happen or left no usable records; the message says why
    (with the end of the server's log when it is the server's fault)."""


def calibration_profile(quick: bool = False, max_model_len: int | None = None) -> Profile:
    """The calibration schedule's load profile: one phase per shape family
    (:data:`SHAPE_FAMILIES`), each of its own request class. ``max_model_len``
    (default: the engine's) bounds the long-context requests' prompt + output."""
    limit = max_model_len or SchedulerConfig().max_model_len
    if limit < 256:
        raise ValueError(f"max_model_len {limit} is too short to calibrate with (>= 256)")
    # Quick: the busy round alone, with shorter outputs (fewer, shorter steps).
    out = 0.6 if quick else 1.0
    # Long contexts: prompt + output up to max_model_len, most of the time decoding
    # (a prefill step per request, hundreds of decode steps over a long context).
    long_prompt = (int(limit * 0.6), int(limit * 0.75))
    long_output = (max(8, int(limit * 0.15 * out)), int(limit * 0.25 * out))
    classes = (
        RequestClass(
            name="decode_heavy",
            prompt_tokens=LengthDistribution.lognormal(24, 0.5, max=64),
            output_tokens=LengthDistribution.uniform(int(150 * out), int(400 * out)),
        ),
        RequestClass(
            name="prefill_burst",
            prompt_tokens=LengthDistribution.uniform(min(600, limit // 4), min(1500, limit // 2)),
            output_tokens=LengthDistribution.uniform(2, 8),
        ),
        RequestClass(
            name="mixed",
            prompt_tokens=LengthDistribution.lognormal(200, 0.7, max=min(1024, limit // 2)),
            output_tokens=LengthDistribution.lognormal(60 * out, 0.6, max=int(256 * out)),
        ),
        RequestClass(
            name="long_context",
            prompt_tokens=LengthDistribution.uniform(*long_prompt),
            output_tokens=LengthDistribution.uniform(*long_output),
        ),
    )
    only = {name: 0.0 for name in SHAPE_FAMILIES}

    def round_of(label: str, rate: float, seconds: float) -> tuple[Phase, ...]:
        """The four families once (decode-heavy twice: at once, then ramped), at
        ``rate`` times their busy rates."""
        return (
            # first, while nothing else runs: on a slow machine the other families'
            # requests are still decoding long after their phase, and short contexts
            # beside the long ones would pull every step's mean context down
            Phase(
                name=f"long_context{label}",
                duration_s=6 * seconds,
                rate=1.0 * rate,
                classes={**only, "long_context": 1.0},
            ),
            # arrivals much faster than they finish: ~100 streams decoding at once
            Phase(
                name=f"decode_heavy{label}",
                duration_s=3 * seconds,
                rate=40.0 * rate,
                classes={**only, "decode_heavy": 1.0},
            ),
            # burstiness 0.05: arrivals in a few clumps of ~20 long prompts
            Phase(
                name=f"prefill_burst{label}",
                duration_s=4 * seconds,
                rate=6.0 * rate,
                burstiness=0.05,
                classes={**only, "prefill_burst": 1.0},
            ),
            Phase(
                name=f"mixed{label}",
                duration_s=6 * seconds,
                rate=8.0 * rate,
                classes={**only, "mixed": 3.0, "decode_heavy": 1.0, "prefill_burst": 0.5},
            ),
            # last (the phases before keep their draws): arrivals rising from a few a
            # second to many, so decode batches of every size from a handful to ~40
            # sequences, each for a while: the sizes a profile's runs spend most steps
            # at. Without it the quick fit saw sizes 4-47 in 8% of its steps (between
            # the long contexts' few and decode_heavy's ~100) and priced them 5-19%
            # high on 1x runs of the default profile.
            Phase(
                name=f"decode_ramp{label}",
                duration_s=8 * seconds,
                rate=2.0 * rate,
                rate_end=20.0 * rate,
                classes={**only, "decode_heavy": 1.0},
            ),
        )

    if quick:
        # Before the busy round, while nothing else runs: requests mostly alone, so
        # prefills of every size beside few decodes. Without them all of a quick run's
        # prefills land in large mixed batches on a slow machine, and the fit cannot
        # tell the prefill terms from the mixed-step one (one put all of prefill in
        # mixed_step_s). The full schedule's light round does this; a phase of it in
        # the full one as well would add thousands of tiny steps, the most variable
        # ones, and they would be most of the held-out steps.
        intro = Phase(
            name="small_batches",
            duration_s=5.0,
            rate=3.0,
            classes={**only, "mixed": 1.0, "prefill_burst": 0.5},
        )
        phases = (intro, *round_of("", 1.0, 1.0))
    else:
        # the busy round twice as long, then a light one (small batches)
        phases = round_of("", 1.0, 2.0) + round_of("_light", 0.3, 2.0)
    return Profile(
        name="calibration_quick" if quick else "calibration",
        seed=20261202,
        description="schedscope calibrate's served schedule: one phase per shape family",
        classes=classes,
        phases=phases,
    )


def calibration_schedule(
    quick: bool = False, max_model_len: int | None = None, seed: int | None = None
) -> list[RequestSpec]:
    """The exact calibration schedule (deterministic for a seed; default: the
    profile's), every request asking for its true output length."""
    profile = calibration_profile(quick, max_model_len)
    specs = build_plan(profile, seed).open_loop_requests()
    return [dataclasses.replace(s, max_tokens=s.output_tokens) for s in specs]


def shape_coverage(steps: pl.DataFrame, max_model_len: int | None = None) -> dict[str, int]:
    """How many steps of a run (steps.parquet columns) fall in each shape family; a
    step may count in more than one (a mixed step of a burst)."""
    import polars as pl

    limit = max_model_len or SchedulerConfig().max_model_len
    prefill, decodes = pl.col("num_prefill_tokens"), pl.col("num_decode_seqs")
    mean_context = pl.col("num_decode_context_tokens") / pl.max_horizontal(decodes, 1)
    families = {
        "decode_heavy": (prefill == 0) & (decodes >= DECODE_HEAVY_SEQS),
        "prefill_burst": prefill >= PREFILL_BURST_TOKENS,
        "mixed": (prefill > 0) & (decodes > 0),
        "long_context": (decodes > 0) & (mean_context >= LONG_CONTEXT_SHARE * limit),
    }
    counts = steps.select(**{k: v.sum() for k, v in families.items()})
    return {k: int(counts[k][0]) for k in SHAPE_FAMILIES}


def _cycles(steps: pl.DataFrame):
    """Each step's cycle but the last's (the start of the next, less its idle wait), of
    steps sorted by ``step``."""
    start = steps["schedule_start"].to_numpy()
    return start[1:] - start[:-1] - steps["idle_before_s"].to_numpy()[1:]


def step_noise(steps: pl.DataFrame) -> float | None:
    """The machine's own step-to-step noise: the median relative difference between
    consecutive decode-only steps of the same batch size (the same work but for a
    context a token longer per sequence). No fit can hold out much better than this;
    None when the run has no such pair."""
    import numpy as np

    steps = steps.sort("step")
    cycles = _cycles(steps)
    seqs = steps["num_seqs"].to_numpy()[:-1]
    decode_only = (steps["num_prefill_tokens"].to_numpy() == 0)[:-1] & (seqs > 0)
    pair = decode_only[1:] & decode_only[:-1] & (seqs[1:] == seqs[:-1])
    pair &= (cycles[1:] > 0) & (cycles[:-1] > 0)
    if not pair.any():
        return None
    return float(np.median(np.abs(cycles[1:][pair] / cycles[:-1][pair] - 1)))


#: Steps at least this far apart count as "seconds apart" for :func:`step_drift`.
DRIFT_GAP_S = 2.0
#: At most this many steps of one shape are compared pairwise (evenly spaced in time).
DRIFT_STEPS_PER_SHAPE = 300


def step_drift(steps: pl.DataFrame) -> float | None:
    """The machine's drift over seconds: the median relative difference between
    decode-only steps of one work, DRIFT_GAP_S or more apart (the same batch size and a
    context per sequence within an eighth of an octave). On a quiet dedicated machine
    it is near :func:`step_noise`; where the machine's speed wanders (a VM whose
    neighbours come and go), a fit's held-out error moves from one calibration to the
    next: measured on a 2-core AMD EPYC VM, 6% within 50 ms, 12% at 0.5-2 s, 22% at
    2 s and more, with held-out errors of 13-14% one hour and 8.5-9.2% (drift 21.6%)
    another. None when no such pair exists."""
    import numpy as np

    steps = steps.sort("step")
    cycles = _cycles(steps)
    head = steps.head(steps.height - 1)
    seqs = head["num_seqs"].to_numpy()
    decode_only = (head["num_prefill_tokens"].to_numpy() == 0) & (seqs > 0) & (cycles > 0)
    if "num_decode_context_tokens" in head.columns:
        context = head["num_decode_context_tokens"].to_numpy() / np.maximum(seqs, 1)
    else:
        context = np.zeros(len(seqs))
    octave8 = np.floor(np.log2(np.maximum(context, 1.0)) * 8).astype(np.int64)
    when = steps["schedule_start"].to_numpy()[:-1]
    diffs = []
    shapes = sorted(
        set(zip(seqs[decode_only].tolist(), octave8[decode_only].tolist(), strict=True))
    )
    for shape in shapes:
        idx = np.flatnonzero(decode_only & (seqs == shape[0]) & (octave8 == shape[1]))
        if len(idx) > DRIFT_STEPS_PER_SHAPE:
            idx = idx[np.linspace(0, len(idx) - 1, DRIFT_STEPS_PER_SHAPE).astype(np.int64)]
        far = np.abs(when[idx][:, None] - when[idx][None, :]) >= DRIFT_GAP_S
        a, b = np.nonzero(np.triu(far, 1))
        diffs.append(np.abs(cycles[idx][a] / cycles[idx][b] - 1))
    pooled = np.concatenate(diffs) if diffs else np.array([])
    return float(np.median(pooled)) if pooled.size else None


#: The knobs that size the device KV pool: when none is given, the calibration server
#: gets a fixed pool of KV_POOL_TOKENS instead (``_serve_args``).
DEVICE_POOL_KNOBS = ("gpu_memory_utilization", "num_gpu_blocks_override", "device_memory")
#: The knobs that size the host (swap) pool: when none is given, a small fixed one.
HOST_POOL_KNOBS = ("swap_space", "num_cpu_blocks_override")
#: The host pool the calibration server gets when no HOST_POOL_KNOBS is given, in blocks.
HOST_POOL_BLOCKS = 512
#: The calibration schedule, written into the records directory as a trace and a TOML
#: profile over it (harness/profiles/schedule_file.py): what Locust runs, and what a
#: user can serve again with ``schedscope run --profile DIR/calibration_schedule.toml``.
SCHEDULE_NAME = "calibration_schedule"
#: Locust's own records and log, under the records directory.
LOCUST_DIR = "locust"
#: How long the load generator waits, after the schedule's last arrival, for the
#: requests still in flight (Locust's --grace): long enough for the slowest machine to
#: drain the full schedule; a request cut by it fails the calibration.
DRAIN_LIMIT_S = 600.0
#: The file beside a served calibration's records that says how they were made (its
#: executor, torch threads, model and serve command; ``calibrate --from-steps DIR``
#: reads it, as it reads a ``schedscope run`` cell's).
RUN_JSON = "run.json"


def serve_args(
    executor: str,
    config: EngineConfig,
    cost_model: Path | None,
    records: Path,
    torch_threads: int | None = None,
) -> list[str]:
    """``schedscope serve`` arguments of the calibration server: ``config``'s knobs that
    differ from the defaults (the shared flag spelling of :func:`harness.serve.knobs.knob_flags`),
    its torch threads, the record files, and the KV pools below unless a knob sizes
    them."""
    given = {name for name, _ in _given_knobs(config)}
    block_size = config.cache.block_size
    args = ["--executor", executor, "--model", config.model, "--block-size", str(block_size)]
    args += knob_flags(
        {k: v for k, v in config_knobs(config).items() if k not in ("model", "block_size")},
        with_policy=True,
    )
    if not given & set(DEVICE_POOL_KNOBS):
        # A KV pool the schedule fits in with room to spare (it never preempts):
        # allocating the default pool (sized from memory) takes longer than the quick
        # schedule's served run, and a pool's size does not change how long a step takes.
        args += ["--num-gpu-blocks-override", str(KV_POOL_TOKENS // block_size)]
    if not given & set(HOST_POOL_KNOBS):
        # likewise a token host pool instead of the default 4 GiB of swap space
        args += ["--num-cpu-blocks-override", str(HOST_POOL_BLOCKS)]
    if torch_threads is not None:
        args += ["--torch-threads", str(torch_threads)]
    args += [
        "--record-steps",
        str(records / "steps.parquet"),
        "--record-requests",
        str(records / "requests.parquet"),
    ]
    # --executor sim without a file sleeps the built-in model's times: said explicitly,
    # or serve would choose this machine's stored fit (docs/serving.md)
    return args + ["--cost-model", str(cost_model) if cost_model else "builtin"]


def _given_knobs(config: EngineConfig) -> list[tuple[str, object]]:
    """(field name, value) of ``config``'s knobs that differ from their defaults."""
    defaults = knob_defaults()
    return [(k, v) for k, v in config_knobs(config).items() if v != defaults.get(k)]


def check_served_inputs(
    executor: str,
    config: EngineConfig,
    cost_model: Path | None,
    torch_threads: int | None = None,
    quick: bool = False,
) -> None:
    """Refuse what cannot be served before starting anything, naming the flag (the
    model is resolved here so a bad --model fails before the server starts)."""
    from engine.worker.loading import resolve_model_config

    if executor not in EXECUTORS:
        raise CalibrateInputError(
            f"unknown executor {executor!r} (choose {' or '.join(EXECUTORS)})", "--executor"
        )
    if torch_threads is not None and torch_threads < 0:
        raise CalibrateInputError(
            f"must be >= 0 (0: serve's default), got {torch_threads}", "--torch-threads"
        )
    if cost_model is not None:
        try:
            CostModel.load(cost_model)
        except (OSError, ValueError, CostModelError) as exc:
            raise CalibrateInputError(f"{cost_model}: {exc}", "--cost-model") from None
    try:
        resolve_model_config(config.model)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise CalibrateInputError(str(exc), "--model") from None
    try:
        calibration_profile(quick, config.scheduler.max_model_len)
    except ValueError as exc:
        raise CalibrateInputError(str(exc), "--max-model-len") from None


def calibrate_served(
    config: EngineConfig | None = None,
    executor: str = "torch",
    cost_model: Path | None = None,
    quick: bool = False,
    seed: int | None = None,
    records_dir: Path | None = None,
    echo: Callable[[str], object] = print,
    console=None,
    torch_threads: int | None = None,
    cpu_split: CpuSplit | None = None,
) -> CostModel:
    """Serve the engine, drive the calibration schedule against it with Locust, fit its
    steps.

    ``config``: the served engine's knobs (default: the engine's defaults; its model,
    its ``max_model_len`` bounding the schedule's long contexts); ``torch_threads``:
    serve's ``--torch-threads`` (None: serve's default); ``cpu_split``: the server's and
    Locust's cores (harness/processes/cpu_split.py; None: not pinned). ``executor``: ``torch`` (the
    model computes) or ``sim`` (each step sleeps what ``cost_model`` predicts, the
    built-in without one: a known truth, for tests). The run's records (steps, engine
    and client requests, the server's log, the schedule as a profile, Locust's records
    and log under ``locust/``, ``run.json`` saying how they were made) stay
    in ``records_dir`` (default: a new temporary directory), so ``calibrate
    --from-steps DIR`` can refit them. Shows a progress bar on ``console`` (a rich
    Console; default: rich's). The fitted model's ``fit`` holds the held-out error and,
    under ``served``, the run's figures and the knobs it was served with.
    """
    import polars as pl
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.sim.cost_fit import client_latency_from_requests
    from harness.profiles.schedule_file import write_schedule_profile
    from harness.records.generator_limited import lagging_stretches
    from harness.records.send_lag import LAG_LIMIT_S
    from harness.run.join import join_requests
    from harness.run.loadgen import LoadDriveError, drive_to_end
    from harness.run.server import ServedEngine, ServerStartError, get_json

    config = config or EngineConfig()
    model = config.model
    max_model_len = config.scheduler.max_model_len
    check_served_inputs(executor, config, cost_model, torch_threads, quick)
    specs = calibration_schedule(quick, max_model_len, seed=seed)
    records = Path(records_dir) if records_dir else Path(tempfile.mkdtemp(prefix="schedscope-cal-"))
    records.mkdir(parents=True, exist_ok=True)
    schedule_file = write_schedule_profile(
        specs,
        calibration_profile(quick, max_model_len).classes,
        records,
        SCHEDULE_NAME,
        description="schedscope calibrate's served schedule, request for request",
    )
    server = ServedEngine(
        serve_args(executor, config, cost_model, records, torch_threads),
        records / "serve.log",
        cpus=cpu_split.serve if cpu_split is not None else None,
    )
    knobs = dict(_given_knobs(config))
    (records / RUN_JSON).write_text(
        json.dumps(
            {
                "kind": "schedscope-calibrate",
                "executor": executor,
                "torch_threads": torch_threads,
                "cpu_split": cpu_split.to_dict() if cpu_split is not None else None,
                "model": model,
                "knobs": knobs,
                "serve_command": server.command[1:],
                "load_generator": f"locust -f {schedule_file.name} (schedscope run's)",
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    started = time.monotonic()
    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            boot = progress.add_task(f"starting schedscope serve --executor {executor}", total=1)
            try:
                url = server.start()
            except ServerStartError as exc:
                raise ServedCalibrationError(f"{exc}; its log ends:\n{exc.log_tail}") from None
            progress.update(boot, completed=1)
            task = progress.add_task(
                f"{'quick ' if quick else ''}calibration schedule (Locust)", total=len(specs)
            )
            try:
                load = drive_to_end(
                    schedule_file,
                    url,
                    records / LOCUST_DIR,
                    limit_s=max(s.open_at for s in specs) + DRAIN_LIMIT_S + 60.0,
                    on_progress=lambda done: progress.update(task, completed=done),
                    grace_s=DRAIN_LIMIT_S,
                    cpus=cpu_split.load_generator if cpu_split is not None else None,
                )
                epoch = get_json(url + "/health")["clock_epoch_unix"]
            except (LoadDriveError, OSError) as exc:
                server.stop()
                raise ServedCalibrationError(
                    f"the served run failed: {exc}\nthe server's log ends:\n{server.log_tail()}"
                ) from None
            stopping = progress.add_task("stopping the server (writing its records)", total=1)
            code = server.stop()
            progress.update(stopping, completed=1)
    finally:
        server.stop()  # once stopped, a no-op; else (a failure, ^C) the server ends too
    served_s = time.monotonic() - started
    if code != 0:
        raise ServedCalibrationError(
            f"schedscope serve exited with {code}; its log ends:\n{server.log_tail()}"
        )
    _record_epoch(records, epoch)
    client = load.client
    client.write_parquet(records / "client.parquet")
    _check_all_served(client, server)
    steps_file = records / "steps.parquet"
    try:
        steps = pl.read_parquet(steps_file)
        engine_requests = pl.read_parquet(records / "requests.parquet")
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ServedCalibrationError(f"{records}: no engine records ({exc})") from None
    lag_p99 = load.summary.get("send_lag_p99_s") or 0.0
    # the client's and the engine's times of each request, as a run cell's records
    # give them (the same definition as a refit of a cell: calibrate --from-steps)
    joined = join_requests(client, engine_requests, epoch, config.scheduler.scheduling_policy, "")
    latency = client_latency_from_requests([joined], max_send_lag_s=LAG_LIMIT_S)
    # when the generator lagged, on the engine's clock: those steps' cycles are left out
    stretches = lagging_stretches(joined, clock_offset_s=epoch)
    coverage = shape_coverage(steps, max_model_len)
    noise = step_noise(steps)
    drift = step_drift(steps)
    echo(
        f"served {client.height} requests in {served_s:.1f} s ({steps.height} steps; "
        + ", ".join(f"{k} {v}" for k, v in coverage.items())
        + f"; client send lag p99 {lag_p99 * 1e3:.1f} ms); records in {records}"
    )
    if noise is not None:
        echo(
            f"step-to-step noise of this machine: {noise:.1%} (consecutive decode steps "
            "of one batch size; a held-out error near it is as good as this machine allows)"
        )
    if drift is not None:
        echo(
            f"drift of this machine over seconds: {drift:.1%} (the same decode step "
            f"{DRIFT_GAP_S:g} s or more apart; where it is far above the noise, this "
            "machine's speed wanders and the held-out error moves from one calibration "
            "to the next)"
        )
    if load.summary.get("generator_limited"):
        echo(
            "warning: the load generator fell behind the schedule (send lag p99 "
            f"{lag_p99 * 1e3:.0f} ms): the engine ran a lighter load than planned, and the "
            "steps of the stretches when it lagged are left out of the fit"
        )
    if latency is None:
        echo("client latency: 0 (no client row joined the engine's records)")
    else:
        echo(
            f"client latency: {latency[0] * 1e3:.2f} ms (median over {latency[1]} requests: "
            "the client's send to its first token, less the engine's arrival to first token)"
        )
    fitted, left_out = fit_served_steps(
        steps,
        stretches,
        model,
        steps_file,
        client_latency_s=latency[0] if latency else 0.0,
        echo=echo,
        lag_p99_s=lag_p99,
    )
    swapped = int((steps["num_blocks_swapped_out"] + steps["num_blocks_swapped_in"]).sum())
    if not swapped:
        # No step swapped, so the fit knows nothing of swapping (it came out 0): keep the
        # built-in price rather than tell --preemption-mode auto that swaps are free.
        fitted = dataclasses.replace(fitted, swap_block_s=CostModel().swap_block_s)
        echo(f"no step swapped: swap_block_s kept at the built-in {fitted.swap_block_s:.2e}")
    device = (
        f"{platform.machine()}, {os.cpu_count()} cores, served "
        f"(--executor {executor}{', quick' if quick else ''})"
    )
    served = {
        "executor": executor,
        "quick": quick,
        "requests": client.height,
        "load_generator": "locust",
        "steps": steps.height,
        "generator_limited_steps_left_out": left_out,
        "generator_limited_s": round(sum(end - start for start, end in stretches), 3),
        "served_s": round(served_s, 2),
        "coverage": coverage,
        "step_noise": noise,
        "step_drift": drift,
        "swapped_blocks": swapped,
        "knobs": knobs,
        "torch_threads": torch_threads,
        "records": str(records),
    }
    return dataclasses.replace(
        fitted, device=device, source="served", fit={**fitted.fit, "served": served}
    )


def fit_served_steps(
    steps: pl.DataFrame,
    stretches: list[tuple[float, float]],
    model: str,
    steps_file: Path,
    client_latency_s: float = 0.0,
    echo: Callable[[str], object] = print,
    lag_p99_s: float = 0.0,
) -> tuple[CostModel, int]:
    """(the cost model fitted to a served calibration's steps, how many of its step
    cycles were left out): those that started inside ``stretches`` (the engine-clock
    stretches when the load generator lagged:
    :func:`harness.records.generator_limited.lagging_stretches`) are, and a line says
    how many of how many. ServedCalibrationError when what is left is too few to fit,
    saying that the generator lagged when it did."""
    from engine.sim.cost_fit import CalibrationError, cycles_outside, fit_cycles
    from harness.records.generator_limited import left_out_line

    try:
        x, y, left_out = cycles_outside(steps, stretches)
    except CalibrationError as exc:
        raise ServedCalibrationError(f"{steps_file}: {exc}") from None
    if left_out:
        echo(left_out_line(left_out, len(y) + left_out, stretches))
    try:
        fitted = fit_cycles(
            x, y, model=model, source=str(steps_file.parent), client_latency_s=client_latency_s
        )
    except CalibrationError as exc:
        if not left_out:
            raise ServedCalibrationError(f"{steps_file}: {exc}") from None
        raise ServedCalibrationError(
            f"{steps_file}: the load generator lagged its schedule (send lag p99 "
            f"{lag_p99_s * 1e3:.0f} ms) while {left_out} of the {len(y) + left_out} step "
            "cycles ran, so they were left out (their time was the generator's as much as "
            f"the engine's), and the {len(y)} left are too few to fit the model's "
            f"{len(FEATURES)} parameters. Calibrate again when the machine has the cores "
            "to spare for the generator"
        ) from None
    return fitted, left_out


def _record_epoch(records: Path, epoch: float) -> None:
    """The engine's ``clock_epoch_unix`` into the records' run.json: the client's rows
    are Unix time and the steps the engine's, and a refit of the records
    (``calibrate --from-steps``) places the generator's lagging stretches among the
    steps with it."""
    from harness.records.generator_limited import EPOCH_KEY

    path = records / RUN_JSON
    info = json.loads(path.read_text())
    path.write_text(json.dumps({**info, EPOCH_KEY: epoch}, indent=2, default=str) + "\n")


def _check_all_served(client: pl.DataFrame, server) -> None:
    """Every request of the schedule answered in full, or the calibration fails naming
    how many were not and the first one's error: the steps would not be the schedule's."""
    import polars as pl

    failed = client.filter(pl.col("status") != "ok")
    if failed.height:
        counts = ", ".join(
            f"{k} {v}" for k, v in sorted(failed.group_by("status").len().iter_rows())
        )
        first = failed.row(0, named=True)
        raise ServedCalibrationError(
            f"{failed.height} of {client.height} requests of the calibration schedule were not "
            f"served ({counts}); the first, {first['request_id']} ({first['prompt_tokens']} "
            f"prompt tokens, max_tokens {first['max_tokens']}): {first.get('error')}; the "
            f"server's log ends:\n{server.log_tail()}"
        )


def calibrate_quickly(fingerprint: Fingerprint) -> CostModel:
    """A quick served calibration for the fingerprint's model, executor and torch threads
    (``schedscope calibrate --quick``: the engine served here with the calibration
    schedule, its step cycles fitted; about a minute on 2 CPU cores), its server pinned
    to the fingerprint's ``serve_cores``, its progress on stderr."""
    import sys

    from rich.console import Console

    from harness.costmodel.fit import CalibrateInputError

    console = Console(stderr=True, markup=False)
    try:
        return calibrate_served(
            EngineConfig(model=fingerprint.model),
            fingerprint.executor,
            quick=True,
            echo=lambda line: print(line, file=sys.stderr),
            console=console,
            torch_threads=fingerprint.torch_threads,
            cpu_split=split_of(fingerprint.serve_cores),
        )
    except (ServedCalibrationError, CalibrateInputError) as exc:
        raise ValueError(f"--cost-model auto: cannot calibrate: {exc}") from None
