"""An external engine's steps, rebuilt from what its streams told the client.

A continuous-batching engine (vLLM, SGLang, the bundled one) emits one token per
running request per step, and its server streams each step's tokens at once. So the
client's token arrival instants (``first_token_at``, then the gaps of ``itl_s``: one
list per request, docs/records.md) cluster: every cluster is one step's end, the
requests in it are the step's batch, and two clusters' distance is a step's duration.
What each request was doing in the step follows from its own stream: its first token
ends its prefill (the prompt's tokens not found in the prefix cache, in chunks of the
token budget before it: the engine's chunked prefill), every later token is one decode
whose context is the prompt plus the tokens before it. That is every feature of
:mod:`engine.core.cost_model` but the swap term and the torch runner's padded
attention, so a fit of these durations is a cost model of the target, priced as the
simulator prices a step (:func:`rebuild`).

Assumptions, and where they break (docs/simulator.md, "A cost model of your engine"):

- one token per request per step, streamed as it is made. A server that sends several
  steps' tokens in one chunk (vLLM's ``--stream-interval`` above 1, a busy API server),
  or a client that reads two chunks at once, puts several tokens in one arrival: such
  chunks are counted (``coalesced_chunks``), and their step and the one after it are
  not measured (``steps_read_late``): they end and start when the client read them.
  Speculative decoding (several tokens per step) breaks this;
- a cluster is one step: arrivals closer than :func:`gaps_of` are one step's, and
  one request never has two tokens in one step. Delivery jitter above that gap splits
  a step in two (a short and a long duration instead of one);
- a step's duration is measured only while the engine was busy throughout: some
  request decoded in the step before and in this one, so the engine ran them back to
  back. A step after an idle gap, or after steps no stream saw (a long prompt's first
  chunks with nothing decoding), is not measured (``steps_not_bounded``);
- steps that started while the load generator lagged its schedule are dropped: its
  late reading of the streams is in their durations
  (:mod:`harness.records.generator_limited`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.core.cost_model import FEATURES, step_features
from engine.sim.cost_fit import Stretches, started_inside
from harness.records.stream_reads import positive_gaps, read_gap_s

#: A cluster closes at a gap wider than this share of the run's short steps (the 5th
#: percentile of the gaps between a request's tokens that are steps, not reads:
#: harness/records/stream_reads.py): distinct steps are at least a short step apart, one
#: step's chunks reach the client within the delivery jitter (a low percentile of all
#: gaps, reads included, would be a read).
CLUSTER_SHARE = 0.5
#: ...and never wider than this (s): a run whose every step is long still has jitter of
#: a few milliseconds, not a tenth of a second.
MAX_CLUSTER_GAP_S = 0.05
#: Consecutive measured steps are fitted in windows of up to this many
#: (:meth:`StreamSteps.windows`).
WINDOW_STEPS = 8


class StreamStepsError(ValueError):
    """The records hold no stream to rebuild steps from; the message says why."""


@dataclass(frozen=True)
class StreamSteps:
    """The rebuilt steps of one run: features and durations of the measured ones, and
    what could not be used, counted."""

    #: one row per measured step, in FEATURES order
    features: np.ndarray
    #: its duration (s): its end less the previous step's end
    seconds: np.ndarray
    #: when it started (the previous step's end, the client's Unix clock)
    starts: np.ndarray
    #: requests in the records, and those with a stream (a first token and its gaps)
    requests: int
    streamed_requests: int
    #: steps seen (clusters), and those measured
    steps: int
    #: steps not measured: the engine may have idled, or run steps no stream saw, since
    #: the step before
    steps_not_bounded: int
    #: steps dropped because they started while the load generator lagged
    generator_limited_steps: int
    #: steps dropped because a chunk of theirs (or of the step before) carried several
    #: steps' tokens: the client read them late
    steps_read_late: int
    #: chunks that carried more than one token (several steps' tokens in one chunk)
    coalesced_chunks: int
    #: the gap that separated steps (s)
    cluster_gap_s: float
    #: (request index, its step's features) of each request whose first token ended a
    #: step that followed an idle or unseen stretch and held it alone: a request sent
    #: to an idle engine (its TTFT from the send is the network, the server and that
    #: one step)
    lone_prefills: list[tuple[int, np.ndarray]] = field(default_factory=list)

    def windows(self, size: int = WINDOW_STEPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(features, seconds, starts) of the measured steps summed in windows of up to
        ``size`` consecutive steps (each starting where the one before it ended). A
        step's measured duration carries the delivery jitter of its two ends, but a
        window's is its last end less its first start: the jitter of the ends inside it
        cancels, while its features add up exactly. On a real vLLM (the CPU backend, its
        API server sharing a core with its engine) steps of 1.4-6 ms around a 3.4 ms mean
        fitted one by one came out 29% short in total; in windows of 8, 4%."""
        if size < 1:
            raise ValueError(f"a window holds at least one step, got {size}")
        ends = self.starts + self.seconds
        rows, seconds, starts = [], [], []
        i = 0
        while i < len(self.seconds):
            j = i
            while j + 1 < len(self.seconds) and j + 1 - i < size and self.starts[j + 1] == ends[j]:
                j += 1
            rows.append(self.features[i : j + 1].sum(axis=0))
            seconds.append(ends[j] - self.starts[i])
            starts.append(self.starts[i])
            i = j + 1
        return (
            np.array(rows, dtype=np.float64).reshape(-1, len(FEATURES)),
            np.array(seconds),
            np.array(starts),
        )

    def usable_line(self) -> str:
        """How much of the run the fit could use, for people."""
        return (
            f"{self.streamed_requests:,} of {self.requests:,} requests streamed tokens; "
            f"{self.steps:,} steps seen in their token times (gap {self.cluster_gap_s * 1e3:.1f} "
            f"ms), {len(self.seconds):,} measured: {self.steps_not_bounded:,} followed an idle "
            f"or unseen stretch, {self.steps_read_late:,} were read late (a chunk carried "
            f"several steps' tokens: {self.coalesced_chunks:,} such chunks), "
            f"{self.generator_limited_steps:,} started while the load generator lagged"
        )


@dataclass
class _Arrival:
    time: float
    request: int
    #: the request's tokens before this chunk (0: its first token)
    position: int
    tokens: int


def arrivals(first_token_at, itl_s, merge_s: float = 0.0) -> tuple[list[_Arrival], int]:
    """Each request's chunks as arrivals (request ``i`` is the i-th of the two lists),
    and how many chunks carried several tokens. Tokens 0 s apart in ``itl_s`` came in
    one chunk (harness/loadgen/client.py); so did tokens within ``merge_s`` of the one
    before (read together: no step is that short)."""
    out: list[_Arrival] = []
    coalesced = 0
    for i, (first, gaps) in enumerate(zip(first_token_at, itl_s, strict=True)):
        if first is None or not np.isfinite(first):
            continue
        current = _Arrival(float(first), i, 0, 1)
        out.append(current)
        at = float(first)
        position = 1
        for gap in gaps or ():
            if gap is None or not np.isfinite(gap) or gap < 0:
                break  # a gap the client could not measure ends what can be placed
            at += float(gap)
            if gap <= merge_s and current.position > 0:
                current.tokens += 1  # a decode read with the one before
            else:
                if current.tokens > 1:
                    coalesced += 1
                current = _Arrival(at, i, position, 1)
                out.append(current)
            position += 1
        if current.tokens > 1:
            coalesced += 1
    out.sort(key=lambda a: a.time)
    return out, coalesced


def gaps_of(itl_s) -> tuple[float, float]:
    """(the gap that separates steps, the gap below which two of a request's tokens were
    read together: :func:`harness.records.stream_reads.read_gap_s`) of a run:
    :data:`CLUSTER_SHARE` of the 5th percentile of the gaps above the read gap (at most
    :data:`MAX_CLUSTER_GAP_S`), and the read gap."""
    gaps = positive_gaps(itl_s)
    if gaps.size == 0:
        return 0.0, 0.0
    read = read_gap_s(itl_s)
    steps = gaps[gaps > read]
    return float(min(MAX_CLUSTER_GAP_S, CLUSTER_SHARE * np.quantile(steps, 0.05))), read


def clusters(events: list[_Arrival], gap_s: float) -> list[list[_Arrival]]:
    """``events`` (in time order) grouped into steps: a step takes the next arrival
    while it comes within ``gap_s`` of the step's first and is of a request not yet in
    it (one token per request per step)."""
    steps: list[list[_Arrival]] = []
    members: set[int] = set()
    for event in events:
        if steps and event.time - steps[-1][0].time <= gap_s and event.request not in members:
            steps[-1].append(event)
            members.add(event.request)
        else:
            steps.append([event])
            members = {event.request}
    return steps


def rebuild(
    first_token_at,
    itl_s,
    prompt_tokens,
    cached_tokens,
    token_budget: int,
    lagging: Stretches = (),
) -> StreamSteps:
    """The steps of one run (the four per-request lists are requests.parquet's columns
    of the same name, ``cached_tokens`` null where unknown: 0 taken), with
    ``token_budget`` the engine's tokens per step (its ``--max-num-batched-tokens``):
    prefills longer than that ran in chunks over the steps before their first token.
    ``lagging``: stretches of the client's clock when the load generator lagged."""
    first_token_at = list(first_token_at)
    itl_s = [list(row) if row is not None else [] for row in itl_s]
    if token_budget < 1:
        raise StreamStepsError(f"the token budget must be >= 1, got {token_budget}")
    gap, read = gaps_of(itl_s)
    events, coalesced = arrivals(first_token_at, itl_s, read)
    streamed = len({e.request for e in events})
    if not events:
        raise StreamStepsError(
            "no request received a token: there is no stream to rebuild steps from"
        )
    if not any(len(row) for row in itl_s):
        raise StreamStepsError(
            "no request received a second token: without token times there are no steps "
            "to rebuild (the run's requests were not streamed, or asked one token each)"
        )
    steps = clusters(events, gap)
    ends = np.array([step[0].time for step in steps])
    prompts = [int(p or 0) for p in prompt_tokens]
    cached = [int(c or 0) for c in cached_tokens]

    # Every step's batch: decodes (a request's later tokens) and prefill chunks (placed
    # before and at its first token).
    decode_seqs = np.zeros(len(steps), dtype=np.int64)
    decode_context = np.zeros(len(steps), dtype=np.int64)
    prefill_tokens = np.zeros(len(steps), dtype=np.int64)
    prefill_seqs = np.zeros(len(steps), dtype=np.int64)
    attention = np.zeros(len(steps), dtype=np.int64)
    # whether some request decoded in this step and in the one before (the engine ran
    # the two back to back)
    bounded = np.zeros(len(steps), dtype=bool)
    # whether a chunk of the step carried several steps' tokens
    read_late = np.zeros(len(steps), dtype=bool)
    last_step: dict[int, int] = {}
    placed_prefill: list[tuple[int, int]] = []  # (first-token step, request)
    chunks: dict[int, int] = {}  # request -> its prefill's chunks
    for k, step in enumerate(steps):
        for event in step:
            previous = last_step.get(event.request)
            last_step[event.request] = k
            if event.position == 0:
                placed_prefill.append((k, event.request))
                continue
            if event.tokens > 1:
                read_late[k] = True
            # a chunk of several tokens: decodes of steps up to this one, counted here
            # (its step is not measured: below)
            p, n = prompts[event.request] + event.position, event.tokens
            decode_seqs[k] += n
            decode_context[k] += n * p + n * (n - 1) // 2
            if previous == k - 1:
                bounded[k] = True
    for k, request in placed_prefill:
        uncached = max(1, prompts[request] - min(cached[request], prompts[request] - 1))
        done = prompts[request] - uncached
        # the chunks, last first: the first token's step took what was left
        sizes: list[int] = []
        left, at = uncached, k
        while left > 0 and at >= 0:
            room = max(1, token_budget - int(decode_seqs[at]))
            sizes.append(min(left, room))
            left -= sizes[-1]
            at -= 1
        chunks[request] = len(sizes)
        for j, size in enumerate(reversed(sizes)):
            at = k - len(sizes) + 1 + j
            done += size
            prefill_tokens[at] += size
            prefill_seqs[at] += 1
            attention[at] += size * done

    rows = [
        step_features(
            int(prefill_tokens[k]),
            int(decode_seqs[k]),
            int(decode_context[k]),
            int(attention[k]),
            0,
            int(prefill_seqs[k]),
            0,
        )
        for k in range(len(steps))
    ]
    features = np.array(rows, dtype=np.float64).reshape(-1, len(FEATURES))
    durations = np.zeros(len(steps))
    durations[1:] = ends[1:] - ends[:-1]
    starts = np.concatenate([[ends[0]], ends[:-1]])
    # A step whose chunks carried several steps' tokens ends when the client read them,
    # not when the engine made them, and the step after it starts then: neither is
    # measured (a client blocked for 200 ms read 100 tokens of one stream at once).
    late = read_late | np.concatenate([[False], read_late[:-1]])
    measured = bounded & (durations > 0) & ~late
    lagged = measured & started_inside(starts, lagging) if lagging else np.zeros_like(measured)
    keep = measured & ~lagged
    lone = [
        (step[0].request, features[k])
        for k, step in enumerate(steps)
        if len(step) == 1
        and step[0].position == 0
        and not bounded[k]
        and prefill_seqs[k] == 1
        and chunks.get(step[0].request) == 1
        and not decode_seqs[k]
        and not (lagging and started_inside(np.array([step[0].time]), lagging)[0])
    ]
    return StreamSteps(
        features=features[keep],
        seconds=durations[keep],
        starts=starts[keep],
        requests=len(first_token_at),
        streamed_requests=streamed,
        steps=len(steps),
        steps_not_bounded=int((~bounded).sum()),
        steps_read_late=int((late & bounded).sum()),
        generator_limited_steps=int(lagged.sum()),
        coalesced_chunks=coalesced,
        cluster_gap_s=gap,
        lone_prefills=lone,
    )
