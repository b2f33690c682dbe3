"""A profile's arrivals as a line of text: requests (or sessions) per time bin drawn
with block characters, the picture docs/profiles.md shows of each profile.

``arrival_chart(profile)`` draws the planned arrivals (single-turn requests and session
starts, open loop); ``send_chart(times, duration_s)`` draws any list of send instants
(a session profile's turns as a simulation sent them). Both scale the tallest bin to a
full block and say what a full block is.
"""

from __future__ import annotations

import numpy as np

from harness.profiles.model import Profile
from harness.profiles.schedule import build_plan

BLOCKS = " ▁▂▃▄▅▆▇█"
WIDTH = 60


def send_chart(times: list[float], duration_s: float, width: int = WIDTH) -> str:
    """``times`` (seconds from the start) in ``width`` bins over ``duration_s``: one
    character per bin, and the rate of a full block."""
    edges = np.linspace(0.0, duration_s, width + 1)
    counts, _ = np.histogram(np.asarray(times, dtype=np.float64), bins=edges)
    peak = int(counts.max()) if counts.size else 0
    if peak == 0:
        return " " * width + "  (none)"
    levels = np.ceil(counts / peak * (len(BLOCKS) - 1)).astype(int)
    line = "".join(BLOCKS[k] for k in levels)
    bin_s = duration_s / width
    return f"{line}  █ = {peak / bin_s:.3g}/s"


def arrival_chart(profile: Profile, width: int = WIDTH) -> str:
    """The planned open-loop arrivals of ``profile`` (its own seed): single-turn
    requests and session starts together."""
    plan = build_plan(profile)
    times = [s.open_at for s in plan.open_loop_requests()]
    times += [s.start_at for s in plan.sessions()]
    return send_chart(times, plan.duration_s, width)
