"""Which of a run's token gaps are the engine's steps and which are the client's reads.

A streaming server sends each step's tokens as the step ends, so the gaps between a
request's tokens (``itl_s``, docs/records.md) are steps: milliseconds. A client that
reads two chunks in one read (a busy load generator), or a server that sends several
steps' tokens in one chunk (a busy API server, vLLM's ``--stream-interval`` above 1),
stamps them microseconds apart. Gaps below :data:`READ_SHARE` of the run's median gap
are such reads (on a real vLLM a quarter of the gaps were 9-40 us against 2.1 ms
steps). A request most of whose gaps are reads reached the client in one go: its TTFT is
its E2E, a delivery delay, not the engine's (:func:`read_at_once`).

harness/calibration/stream_steps.py rebuilds steps from the other gaps; the report's
"Simulator vs this run" counts the requests read at once (the simulator cannot know a
delivery delay)."""

from __future__ import annotations

import numpy as np

#: A gap below this share of the run's median gap is a read, not a step.
READ_SHARE = 0.1
#: A request is read at once when at least this share of its gaps (and at least
#: :data:`MIN_GAPS` of them) are reads.
AT_ONCE_SHARE = 0.9
MIN_GAPS = 4


def positive_gaps(itl_s) -> np.ndarray:
    """Every positive gap of every request's ``itl_s`` list (None or empty: none)."""
    return np.array([g for row in itl_s if row for g in row if g and g > 0], dtype=float)


def read_gap_s(itl_s) -> float:
    """The gap below which two of a request's tokens were read together, for a run whose
    requests' gaps are ``itl_s`` (0 when it has none)."""
    gaps = positive_gaps(itl_s)
    return READ_SHARE * float(np.median(gaps)) if gaps.size else 0.0


def read_at_once(request_ids, itl_s) -> list:
    """The ids of the requests whose streams reached the client in one go (lists, one
    per request: ``itl_s`` as Python lists, None for a request without gaps)."""
    itl_s = list(itl_s)
    read = read_gap_s(itl_s)
    out = []
    for request_id, gaps in zip(request_ids, itl_s, strict=True):
        if gaps is None or len(gaps) < MIN_GAPS:
            continue
        if np.mean(np.array(gaps, dtype=float) <= read) >= AT_ONCE_SHARE:
            out.append(request_id)
    return out
