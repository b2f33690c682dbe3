"""How fast this machine runs the torch engine against a cost model's prices: a probe of
a few seconds.

A cost model describes one machine. The built-in one was fitted on another, so on this
one its prices can be off by several times (a slower CPU model, a server pinned to one
core, a GPU). ``schedscope run --rate-scale auto`` with the built-in cost model forced
(``--cost-model builtin``) would then set the load against that other machine's
capacity. Before it simulates the capacity, it probes: the torch executor (the cell's
model, block size, torch threads and the server's cores) runs a few mixed step shapes
(prefill chunks over contexts, decodes of many lengths, swaps — the calibration's
held-out kind), a few times each, and the ratio of their measured time to the model's
price of the same steps' compute is this machine's speed against it. The capacity is
then simulated with the model at that speed (:meth:`CostModel.at_speed`).

It assumes what a speed is: one factor for every term, the server's Python work per
step and per sequence included, which a bare runner does not do — on one CPU both move
with its speed, roughly (measured on a 2-core AMD VM: a probe of 2.02x put the capacity
20% above a fit of served steps; the built-in as it was, 2.5x above). On a GPU the
model's compute and the server's Python work do not move together, so there is no
probe there. A fit of this machine's served steps (``schedscope calibrate``) prices
each term on its own, and is what ``--cost-model auto`` uses.

The probe runs in a child process (``python -m harness.costmodel.speed_probe``) pinned
to the server's cores with the server's thread count, so the run's own process imports
no torch and keeps its affinity.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from engine.core.cost_model import CostModel

#: Step shapes the probe times (mixed batches, a fixed seed) and how often each.
NUM_SHAPES = 8
REPEATS = 3
SHAPES_SEED = 7
TIMEOUT_S = 180.0


class SpeedProbeError(RuntimeError):
    """The probe could not run or measured nothing; the message says why."""


@dataclass(frozen=True)
class SpeedProbe:
    """This machine's step time over a cost model's price (2.0: its steps take twice
    as long), and how it was measured."""

    ratio: float
    num_shapes: int
    repeats: int
    seconds: float  # the probe's wall time, the child's start included
    threads: int
    cpus: tuple[int, ...] | None

    def line(self) -> str:
        where = f" on CPU {','.join(map(str, self.cpus))}" if self.cpus else ""
        return (
            f"a {self.seconds:.0f}-second probe of the torch executor ({self.num_shapes} "
            f"step shapes x {self.repeats}, {self.threads} thread(s){where}) took "
            f"{self.ratio:.2f}x the model's price of their compute"
        )


def speed_ratio(reference: CostModel, features: list[list[float]], seconds: list[float]) -> float:
    """Measured seconds over ``reference``'s price of the same steps' compute (its
    price less the per-step overhead, which a bare runner does not pay)."""
    if not seconds or len(features) != len(seconds):
        raise SpeedProbeError("the probe measured no step")
    try:
        priced = sum(reference.predict_features(f) - reference.step_overhead_s for f in features)
        measured = float(sum(seconds))
    except (TypeError, ValueError) as exc:  # a child's output that is not what it prints
        raise SpeedProbeError(
            f"the probe's result is not step features and seconds ({exc})"
        ) from None
    if not (0 < priced < math.inf and 0 < measured < math.inf):
        raise SpeedProbeError(
            f"the probe's steps took {measured:.3g} s against a price of {priced:.3g} s"
        )
    return measured / priced


def probe_speed(
    reference: CostModel,
    model: str,
    *,
    block_size: int,
    threads: int,
    cpus: tuple[int, ...] | None = None,
    timeout_s: float = TIMEOUT_S,
) -> SpeedProbe:
    """Run the probe in a child process and compare it with ``reference``. Raises
    :class:`SpeedProbeError` when it fails or times out."""
    command = [
        sys.executable, "-m", "harness.costmodel.speed_probe",
        "--model", model, "--block-size", str(block_size), "--threads", str(threads),
    ]  # fmt: skip
    if cpus:
        command += ["--cpus", ",".join(map(str, cpus))]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SpeedProbeError(f"the probe did not finish within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SpeedProbeError(f"the probe exited {done.returncode}: {tail[0]}")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        features, seconds = result["features"], result["seconds"]
    except (ValueError, IndexError, KeyError, TypeError):
        raise SpeedProbeError("the probe printed no result") from None
    return SpeedProbe(
        ratio=speed_ratio(reference, features, seconds),
        num_shapes=len(seconds),
        repeats=REPEATS,
        seconds=time.monotonic() - started,
        threads=threads,
        cpus=cpus,
    )


def _measure(model: str, block_size: int) -> dict:
    """The child's work: the shapes' features and median seconds on this machine."""
    from engine.sim.calibration import holdout_mix, measure
    from engine.worker.loading import calibration_runner

    shapes = holdout_mix(NUM_SHAPES, seed=SHAPES_SEED, quick=True)
    runner, _ = calibration_runner(model, block_size, shapes)
    seconds = measure(runner, shapes, repeats=REPEATS)
    return {"features": [s.features() for s in shapes], "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Time the torch executor's steps (a probe).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--cpus", default="")
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps(_measure(args.model, args.block_size)))


if __name__ == "__main__":
    main()
