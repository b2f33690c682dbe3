"""Turning a profile and a seed into one exact request schedule.

`build_plan(profile, seed)` gives the whole run (`Plan`); `sample_requests(profile, n,
seed)` gives exactly n open-loop requests. Both are free functions rather than methods
so that the profile model stays data and does not depend on this module.

Determinism: every random draw comes from its own numpy stream keyed by
(seed; phase index, purpose, block, class index) through SeedSequence's spawn_key, so
a schedule is identical across processes (for one numpy version) and editing one phase
or class does not shift the draws of the others. `block` is the repetition cycle for
open phases and the chunk number for closed phases.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np

from harness.profiles.errors import ProfileError, check_int
from harness.profiles.model import Phase, Profile

# Stream purposes (part of the spawn key; never renumber, it would change every schedule).
_ARRIVALS, _CLASSES, _PROMPT, _OUTPUT = 0, 1, 2, 3
_SYSTEM_CHOICE, _SYSTEM_LENGTHS, _TURNS, _THINK = 4, 5, 6, 7
#: The "phase" of draws made once per profile (a class's system prompt lengths).
_PROFILE_LEVEL = 1 << 20

# Closed-phase specs are drawn in chunks of this many so that the k-th spec does not
# depend on how the caller consumed the ones before it.
CLOSED_CHUNK = 256


@dataclass(slots=True)
class RequestSpec:
    """One request to send. `scheduled_at` is seconds from the start of the run for
    open-loop phases and None for closed-loop ones (the driver picks the time) and for
    a session's turns after its first (sent `think_time_s` after the previous turn's
    answer). `index` is the position among the open-loop requests of the plan (or of
    `sample_requests`), the position within its phase for closed-loop ones, and the
    session's index for a session's turns.

    What the prompt is made of (`harness.profiles.prompt_layout`): `shared` segments
    first — (key, tokens) pairs whose content is the same in every prompt that names
    the key (a system prompt, a reuse rung's document, a trace's hash block) — then the
    request's own tokens. `prompt_tokens` is the whole prompt as planned; a session
    turn's is planned with answers of exactly `output_tokens` and one role marker per
    chat message (`session_prompt_tokens`), and its own part is `message_tokens`."""

    request_id: str
    index: int
    phase: int
    class_name: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    priority: int
    scheduled_at: float | None
    shared: tuple[tuple[str, int], ...] = ()
    session_id: str | None = None
    turn: int | None = None  # 1 for a session's first turn
    think_time_s: float | None = None  # a later turn's wait after the previous answer
    message_tokens: int | None = None  # a session turn's new message

    @property
    def shared_tokens(self) -> int:
        return sum(n for _, n in self.shared)

    @property
    def own_tokens(self) -> int:
        """The tokens of this request's own content: a session turn's new message, or
        the prompt after its shared segments."""
        if self.message_tokens is not None:
            return self.message_tokens
        return self.prompt_tokens - self.shared_tokens

    @property
    def open_at(self) -> float:
        """`scheduled_at` of an open-loop request, which always has one."""
        assert self.scheduled_at is not None, "an open-loop request"
        return self.scheduled_at


def _rng(seed: int, phase: int, purpose: int, block: int, cls: int = 0) -> np.random.Generator:
    return np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(phase, purpose, block, cls))
    )


def _arrival_times(
    phase: Phase, seed: int, phase_index: int, block: int, start_s: float, end_s: float
) -> np.ndarray:
    """Open-loop arrival times in [start_s, end_s), ascending, shape (k,)."""
    rate, shape = phase.rate, phase.burstiness
    assert rate is not None and phase.duration_s is not None
    rng = _rng(seed, phase_index, _ARRIVALS, block)
    if phase.rate_end is not None:
        return start_s + _ramp_offsets(phase, rng)
    expected = rate * phase.duration_s
    # Enough gaps to cover the phase with overwhelming probability (the count's
    # variance is about expected/burstiness); draw more in the rare case it isn't.
    batch = int(expected + 8.0 * math.sqrt(expected / shape) + 16)
    offsets: list[np.ndarray] = []
    last = 0.0
    while last < phase.duration_s:
        cum = last + np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=batch))
        offsets.append(cum)
        last = float(cum[-1])
    times = start_s + np.concatenate(offsets)
    # Cut on the absolute time so that end_s (= the next phase's start_s) is excluded.
    return times[: np.searchsorted(times, end_s, side="left")]


def _ramp_offsets(phase: Phase, rng: np.random.Generator) -> np.ndarray:
    """Offsets into a ramp phase (rate linear from `rate` to `rate_end`).

    Time-rescaling: a renewal process of unit-mean gamma gaps (shape = burstiness)
    in operational time u, mapped through the inverse of the cumulative intensity
    L(t) = r0 t + (r1 - r0) t^2 / (2 d). burstiness 1 gives exactly an inhomogeneous
    Poisson process; otherwise the local CV of gaps is 1/sqrt(burstiness)."""
    r0, r1, d, shape = phase.rate, phase.rate_end, phase.duration_s, phase.burstiness
    assert r0 is not None and r1 is not None and d is not None
    total = (r0 + r1) / 2 * d  # L(d)
    batch = int(total + 8.0 * math.sqrt(total / shape) + 16)
    parts: list[np.ndarray] = []
    last = 0.0
    while last < total:
        cum = last + np.cumsum(rng.gamma(shape, 1.0 / shape, size=batch))
        parts.append(cum)
        last = float(cum[-1])
    u = np.concatenate(parts)
    u = u[: np.searchsorted(u, total, side="left")]
    slope = (r1 - r0) / d
    # t = L^-1(u), in the form that stays exact as slope -> 0.
    t = 2.0 * u / (r0 + np.sqrt(np.maximum(r0 * r0 + 2.0 * slope * u, 0.0)))
    # L^-1 is increasing, but two nearly equal u (bursty gaps ~0) can round one ulp the
    # wrong way: keep the arrivals in order.
    t = np.maximum.accumulate(t)
    return t[t < d]


@dataclass(slots=True)
class _Draws:
    """Per-request draws, each an array of shape (n,). `system_index`: the system prompt
    drawn (-1: none). A session class's arrivals have zeros here: their turns are drawn
    by `_draw_sessions`."""

    class_index: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    max_tokens: np.ndarray
    system_index: np.ndarray
    trace_row: np.ndarray  # the trace row replayed (-1: not a trace phase's)

    def where(self, mask: np.ndarray) -> _Draws:
        return _Draws(*(getattr(self, f)[mask] for f in _DRAW_FIELDS))


_DRAW_FIELDS = tuple(f.name for f in fields(_Draws))


def _draw_requests(profile: Profile, seed: int, phase_index: int, block: int, n: int) -> _Draws:
    weights = profile.class_weights(phase_index)
    cum = np.cumsum(weights) / weights.sum()
    # side="right": a zero-weight class (zero-width interval) is never chosen.
    class_index = np.searchsorted(
        cum, _rng(seed, phase_index, _CLASSES, block).random(n), side="right"
    )
    prompt = np.zeros(n, dtype=np.int64)
    output = np.zeros(n, dtype=np.int64)
    max_tokens = np.zeros(n, dtype=np.int64)
    system = np.full(n, -1, dtype=np.int64)
    for j, rc in enumerate(profile.classes):
        where = np.flatnonzero(class_index == j)
        if where.size == 0 or rc.session is not None:
            continue  # (a session's turns are drawn by _draw_sessions)
        if rc.system_prompt is not None:
            system[where] = rc.system_prompt.choose(
                _rng(seed, phase_index, _SYSTEM_CHOICE, block, j), where.size
            )
        prompt[where] = rc.prompt_tokens.sample(
            _rng(seed, phase_index, _PROMPT, block, j), where.size
        )
        out = rc.output_tokens.sample(_rng(seed, phase_index, _OUTPUT, block, j), where.size)
        if rc.max_tokens is not None:
            out = np.minimum(out, rc.max_tokens)
            max_tokens[where] = rc.max_tokens
        else:
            max_tokens[where] = out
        output[where] = out
    return _Draws(class_index, prompt, output, max_tokens, system, np.full(n, -1, dtype=np.int64))


def _trace_draws(profile: Profile, phase: Phase, n: int) -> _Draws:
    """The first n requests of a trace phase: lengths and classes as the trace says;
    the client sends max_tokens = the trace's output length."""
    trace = phase.trace
    assert trace is not None
    names = [c.name for c in profile.classes]
    default = names.index(trace.default_class) if trace.default_class else 0
    class_index = np.array(
        [default if c is None else names.index(c) for c in trace.classes[:n]], dtype=np.int64
    )
    output = trace.output_tokens[:n].copy()
    return _Draws(
        class_index,
        trace.prompt_tokens[:n].copy(),
        output,
        output.copy(),
        np.full(n, -1, dtype=np.int64),
        np.arange(n, dtype=np.int64),
    )


def _open_phase(
    profile: Profile, seed: int, phase_index: int, block: int, start_s: float, end_s: float
) -> tuple[np.ndarray, _Draws]:
    """Arrival times in [start_s, end_s) and per-request draws of one open phase."""
    phase = profile.phases[phase_index]
    if phase.trace is not None:
        times = start_s + phase.trace.offsets_s
        times = times[: np.searchsorted(times, end_s, side="left")]
        return times, _trace_draws(profile, phase, times.size)
    times = _arrival_times(phase, seed, phase_index, block, start_s, end_s)
    return times, _draw_requests(profile, seed, phase_index, block, times.size)


def _specs(
    profile: Profile,
    seed: int,
    ids: list[str],
    indices: range,
    phases: list[int],
    draws: _Draws,
    times: list[float] | list[None],
) -> list[RequestSpec]:
    names = [c.name for c in profile.classes]
    priorities = [c.priority for c in profile.classes]
    specs = [
        RequestSpec(rid, i, ph, names[c], p, o, m, priorities[c], t)
        for rid, i, ph, c, p, o, m, t in zip(
            ids,
            indices,
            phases,
            draws.class_index.tolist(),
            draws.prompt_tokens.tolist(),
            draws.output_tokens.tolist(),
            draws.max_tokens.tolist(),
            times,
            strict=True,
        )
    ]
    _add_shared(profile, seed, specs, draws)
    return specs


def _add_shared(profile: Profile, seed: int, specs: list[RequestSpec], draws: _Draws) -> None:
    """Give each single-turn spec its shared prefix: its class's system prompt (the
    prompt then holds it before the drawn length), its phase's reuse document (a share
    of the drawn length), or its trace row's hash blocks (a Mooncake trace)."""
    rungs = {i: p for i, p in enumerate(profile.phases) if p.prefix_reuse}
    traces = {
        i: p.trace for i, p in enumerate(profile.phases) if p.trace is not None and p.trace.hash_ids
    }
    system_lengths: dict[int, list[int]] = {}
    if not rungs and not traces and not (draws.system_index >= 0).any():
        return
    classes, systems = draws.class_index.tolist(), draws.system_index.tolist()
    rows = draws.trace_row.tolist()
    for spec, c, k, row in zip(specs, classes, systems, rows, strict=True):
        if row >= 0 and spec.phase in traces:
            blocks = traces[spec.phase].hash_blocks(row, spec.prompt_tokens)
            spec.shared = tuple((hash_key(profile.name, h), n) for h, n in blocks)
        elif k >= 0:
            rc = profile.classes[c]
            if c not in system_lengths:
                system_lengths[c] = system_prompt_lengths(profile, seed, c)
            n = system_lengths[c][k]
            spec.shared = ((system_prompt_key(profile.name, rc.name, k), n),)
            spec.prompt_tokens += n
        elif spec.phase in rungs:
            phase = rungs[spec.phase]
            assert phase.prefix_reuse is not None
            n = min(round(phase.prefix_reuse * spec.prompt_tokens), spec.prompt_tokens - 1)
            if n > 0:
                spec.shared = ((reuse_key(profile.name, phase.name), n),)


def system_prompt_key(profile_name: str, class_name: str, k: int) -> str:
    """The content key of system prompt ``k`` of a class."""
    return f"{profile_name}/system/{class_name}/{k}"


def hash_key(profile_name: str, hash_id: int) -> str:
    """The content key of a trace's hash block (every request naming the id shares it)."""
    return f"{profile_name}/hash/{hash_id}"


def reuse_key(profile_name: str, phase_name: str) -> str:
    """The content key of a reuse rung's shared document."""
    return f"{profile_name}/reuse/{phase_name}"


def system_prompt_lengths(profile: Profile, seed: int, class_index: int) -> list[int]:
    """The length of each system prompt of class ``class_index``: drawn once per
    profile and seed, the same in every phase."""
    prompts = profile.classes[class_index].system_prompt
    assert prompts is not None
    rng = _rng(seed, _PROFILE_LEVEL, _SYSTEM_LENGTHS, 0, class_index)
    return prompts.tokens.sample(rng, prompts.count).tolist()


def session_prompt_tokens(system_tokens: int, messages: list[int], answers: list[int]) -> int:
    """The prompt of a session turn whose new message is ``messages[-1]``, after the
    turns of ``messages[:-1]`` answered with ``answers``: chat messages (system, then
    user and assistant in turn, then the new user message, then the assistant's cue),
    each message its content and one role marker (the bundled engine's chat template)."""
    total = 1 + system_tokens if system_tokens else 0
    for message, answer in zip(messages[:-1], answers, strict=True):
        total += 2 + message + answer
    return total + 2 + messages[-1]


@dataclass(slots=True)
class SessionSpec:
    """One session of a plan: its turns in order. The first is sent at `start_at`
    (seconds from the run's start, open loop); each later one its `think_time_s` after
    the answer before it ended."""

    session_id: str
    index: int  # among the plan's sessions
    phase: int
    class_name: str
    start_at: float
    turns: list[RequestSpec]


def _draw_sessions(
    profile: Profile,
    seed: int,
    phase_index: int,
    block: int,
    times: np.ndarray,
    class_index: np.ndarray,
    first_index: int,
) -> list[SessionSpec]:
    """The sessions among one block's arrivals (``times``, ``class_index``: every
    arrival's), numbered from ``first_index`` in arrival order."""
    found: list[tuple[int, int, list[RequestSpec], str]] = []  # (arrival, class, turns, id)
    for j, rc in enumerate(profile.classes):
        session = rc.session
        if session is None:
            continue
        where = np.flatnonzero(class_index == j)
        if where.size == 0:
            continue
        turns = session.turns.sample(_rng(seed, phase_index, _TURNS, block, j), where.size)
        total = int(turns.sum())
        messages = rc.prompt_tokens.sample(_rng(seed, phase_index, _PROMPT, block, j), total)
        answers = rc.output_tokens.sample(_rng(seed, phase_index, _OUTPUT, block, j), total)
        if rc.max_tokens is not None:
            answers = np.minimum(answers, rc.max_tokens)
        thinks = session.think_time_s.sample(
            _rng(seed, phase_index, _THINK, block, j), total
        ).tolist()
        system = np.full(where.size, -1, dtype=np.int64)
        lengths: list[int] = []
        if rc.system_prompt is not None:
            system = rc.system_prompt.choose(
                _rng(seed, phase_index, _SYSTEM_CHOICE, block, j), where.size
            )
            lengths = system_prompt_lengths(profile, seed, j)
        ms, outs = messages.tolist(), answers.tolist()
        at = 0
        for arrival, n, k in zip(where.tolist(), turns.tolist(), system.tolist(), strict=True):
            shared: tuple[tuple[str, int], ...] = ()
            if k >= 0:
                shared = ((system_prompt_key(profile.name, rc.name, k), lengths[k]),)
            system_tokens = shared[0][1] if shared else 0
            specs = []
            for t in range(n):
                message, answer = ms[at + t], outs[at + t]
                prompt = session_prompt_tokens(
                    system_tokens, ms[at : at + t + 1], outs[at : at + t]
                )
                specs.append(
                    RequestSpec(
                        "",  # named below, once the session's number is known
                        0,
                        phase_index,
                        rc.name,
                        prompt,
                        answer,
                        rc.max_tokens if rc.max_tokens is not None else answer,
                        rc.priority,
                        float(times[arrival]) if t == 0 else None,
                        shared,
                        None,
                        t + 1,
                        None if t == 0 else thinks[at + t],
                        message,
                    )
                )
            at += n
            found.append((arrival, j, specs, ""))
    found.sort(key=lambda f: f[0])
    sessions = []
    prefix = f"{profile.name}-{seed}-s"
    for number, (arrival, j, specs, _) in enumerate(found, start=first_index):
        session_id = f"{prefix}{number:07d}"
        for spec in specs:
            spec.request_id = f"{session_id}-t{spec.turn:03d}"
            spec.index = number
            spec.session_id = session_id
        sessions.append(
            SessionSpec(
                session_id,
                number,
                phase_index,
                profile.classes[j].name,
                float(times[arrival]),
                specs,
            )
        )
    return sessions


def _open_ids(profile: Profile, seed: int, indices: range) -> list[str]:
    prefix = f"{profile.name}-{seed}-"
    return [f"{prefix}{i:07d}" for i in indices]


@dataclass
class PhasePlan:
    """One phase of a plan. Open phases carry their single-turn `requests` and their
    `sessions`; closed phases hand out an unbounded deterministic sequence through
    `next_request()` / `request_at(k)`."""

    index: int
    phase: Phase
    start_s: float
    end_s: float
    requests: list[RequestSpec]
    _profile: Profile = field(repr=False)
    _seed: int = field(repr=False)
    _cursor: int = field(default=0, repr=False)
    _chunk: tuple[int, list[RequestSpec]] | None = field(default=None, repr=False)
    sessions: list[SessionSpec] = field(default_factory=list)

    @property
    def kind(self) -> Literal["open", "closed"]:
        return self.phase.kind

    @property
    def concurrency(self) -> int | None:
        return self.phase.concurrency

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def next_request(self) -> RequestSpec:
        """The next spec of a closed phase; the k-th call returns `request_at(k)`."""
        spec = self.request_at(self._cursor)
        self._cursor += 1
        return spec

    def request_at(self, k: int) -> RequestSpec:
        """The k-th spec (k >= 0) of a closed phase, scheduled_at=None."""
        if self.kind != "closed":
            raise ValueError(f"phase {self.phase.name!r} is open-loop: use .requests")
        check_int("k", k, minimum=0)
        chunk_no = k // CLOSED_CHUNK
        if self._chunk is None or self._chunk[0] != chunk_no:
            self._chunk = (chunk_no, self._closed_chunk(chunk_no))
        return self._chunk[1][k % CLOSED_CHUNK]

    def _closed_chunk(self, chunk_no: int) -> list[RequestSpec]:
        first = chunk_no * CLOSED_CHUNK
        indices = range(first, first + CLOSED_CHUNK)
        prefix = f"{self._profile.name}-{self._seed}-c{self.index}-"
        return _specs(
            self._profile,
            self._seed,
            [f"{prefix}{k:07d}" for k in indices],
            indices,
            [self.index] * CLOSED_CHUNK,
            _draw_requests(self._profile, self._seed, self.index, chunk_no, CLOSED_CHUNK),
            [None] * CLOSED_CHUNK,
        )


@dataclass
class Plan:
    """The schedule of one run: the profile's phases laid end to end from t=0."""

    profile: Profile
    seed: int
    phases: list[PhasePlan]

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s

    @property
    def num_open_requests(self) -> int:
        return sum(len(p.requests) for p in self.phases)

    def sessions(self) -> list[SessionSpec]:
        """Every session of the plan, in start (and index) order."""
        return [s for p in self.phases for s in p.sessions]

    @property
    def session_tail_s(self) -> float:
        """Seconds past the schedule's end that its sessions' think times alone reach:
        a session's later turns are sent after the turns before them, so they can go on
        after the last phase (the answers' own time comes on top)."""
        ends = [s.start_at + sum(t.think_time_s or 0.0 for t in s.turns) for s in self.sessions()]
        return max(0.0, max(ends, default=0.0) - self.duration_s)

    def open_loop_requests(self) -> list[RequestSpec]:
        """Every open-loop spec of the plan, in time (and index) order."""
        return [spec for p in self.phases for spec in p.requests]

    def phase_at(self, t: float) -> PhasePlan | None:
        """The phase running at `t` seconds into the run, None once the run is over."""
        for p in self.phases:
            if p.start_s <= t < p.end_s:
                return p
        return None


def _phase_bounds(durations: list[float], base: float = 0.0) -> list[tuple[float, float]]:
    # Both ends come from the same expression so a phase's end_s == the next start_s.
    offsets = np.concatenate([[0.0], np.cumsum(durations)]).tolist()
    return [(base + offsets[i], base + offsets[i + 1]) for i in range(len(durations))]


def build_plan(profile: Profile, seed: int | None = None) -> Plan:
    """The schedule of `profile` for `seed` (default: the profile's own seed)."""
    seed = profile.seed if seed is None else seed
    check_int("seed", seed, minimum=0)
    bounds = _phase_bounds([p.length_s for p in profile.phases])
    phases: list[PhasePlan] = []
    num_open = num_sessions = 0
    session_classes = np.array([c.session is not None for c in profile.classes])
    for i, (phase, (start, end)) in enumerate(zip(profile.phases, bounds, strict=True)):
        requests: list[RequestSpec] = []
        sessions: list[SessionSpec] = []
        if phase.kind == "open":
            requests, sessions = _open_block(
                profile, seed, i, 0, (start, end), session_classes, num_open, num_sessions
            )
            num_open += len(requests)
            num_sessions += len(sessions)
        phases.append(PhasePlan(i, phase, start, end, requests, profile, seed, sessions=sessions))
    return Plan(profile, seed, phases)


def _open_block(
    profile: Profile,
    seed: int,
    phase_index: int,
    block: int,
    window: tuple[float, float],
    session_classes: np.ndarray,
    first_open: int,
    first_session: int,
) -> tuple[list[RequestSpec], list[SessionSpec]]:
    """One block of an open phase's arrivals in ``window``: its single-turn requests
    (numbered from ``first_open``) and its sessions (from ``first_session``).
    ``session_classes``: which of the profile's classes are session classes."""
    times, draws = _open_phase(profile, seed, phase_index, block, *window)
    starts = session_classes[draws.class_index]
    sessions: list[SessionSpec] = []
    if starts.any():
        sessions = _draw_sessions(
            profile, seed, phase_index, block, times, draws.class_index, first_session
        )
        times, draws = times[~starts], draws.where(~starts)
    indices = range(first_open, first_open + times.size)
    requests = _specs(
        profile,
        seed,
        _open_ids(profile, seed, indices),
        indices,
        [phase_index] * times.size,
        draws,
        times.tolist(),
    )
    return requests, sessions


def _phase_may_have_arrivals(phase: Phase) -> bool:
    if phase.trace is not None:
        return bool(phase.trace.num_requests) and float(phase.trace.offsets_s[0]) < phase.length_s
    return True


def sample_requests(profile: Profile, n: int, seed: int | None = None) -> list[RequestSpec]:
    """Exactly `n` open-loop requests in time order, cycling the open phases back to
    back (closed phases skipped); `seed` defaults to the profile's own. For an all-open
    profile the first cycle equals `build_plan(profile, seed).open_loop_requests()`,
    and a shorter sample is a prefix of a longer one. A session's turns are sampled as
    requests of their own (`flatten_turn`: what sizes an engine's capacity on the mix;
    their closed-loop timing is no part of a sample). Raises ProfileError when the
    profile has no open-loop phase."""
    seed = profile.seed if seed is None else seed
    check_int("n", n, minimum=0)
    check_int("seed", seed, minimum=0)
    open_phases = [i for i, p in enumerate(profile.phases) if p.kind == "open"]
    if not open_phases:
        raise ProfileError(f"phases: profile {profile.name!r} has no open-loop (`rate`) phase")
    if n == 0:
        return []
    durations = [profile.phases[i].length_s for i in open_phases]
    if not any(_phase_may_have_arrivals(profile.phases[i]) for i in open_phases):
        raise ProfileError(f"phases: profile {profile.name!r} has no arrivals to cycle")
    if profile.has_sessions:
        return _sample_with_sessions(profile, n, seed, open_phases, durations)
    period = float(sum(durations))
    times_parts: list[np.ndarray] = []
    phase_parts: list[np.ndarray] = []
    draw_parts: list[_Draws] = []
    total = 0
    cycle = 0
    while total < n:
        for i, (start, end) in zip(
            open_phases, _phase_bounds(durations, cycle * period), strict=True
        ):
            times, draws_i = _open_phase(profile, seed, i, cycle, start, end)
            times_parts.append(times)
            phase_parts.append(np.full(times.size, i, dtype=np.int64))
            draw_parts.append(draws_i)
            total += times.size
        cycle += 1
    draws = _Draws(*(np.concatenate([getattr(d, f) for d in draw_parts])[:n] for f in _DRAW_FIELDS))
    indices = range(n)
    return _specs(
        profile,
        seed,
        _open_ids(profile, seed, indices),
        indices,
        np.concatenate(phase_parts)[:n].tolist(),
        draws,
        np.concatenate(times_parts)[:n].tolist(),
    )


def flatten_turn(turn: RequestSpec, start_at: float) -> RequestSpec:
    """A session's turn as a request of its own arriving at ``start_at``: its prompt
    the same length, laid out as the system prompt (and its role marker), the
    conversation before it as one segment of its session (so a later turn of the same
    session shares the earlier ones' history, as a prefix cache would find it), then
    the new message and the markers around it as its own tokens."""
    assert turn.message_tokens is not None and turn.session_id is not None
    shared = tuple((key, n + 1) for key, n in turn.shared)  # with the system marker
    own = turn.message_tokens + 2
    history = turn.prompt_tokens - sum(n for _, n in shared) - own
    if history > 0:
        shared += ((f"{turn.session_id}/history", history),)
    # no session_id or turn: a sample's requests are no conversation (they all arrive at
    # their session's start), and records of one must not read as sessions
    return dataclasses.replace(
        turn,
        scheduled_at=start_at,
        shared=shared,
        message_tokens=None,
        think_time_s=None,
        session_id=None,
        turn=None,
    )


def _sample_with_sessions(
    profile: Profile, n: int, seed: int, open_phases: list[int], durations: list[float]
) -> list[RequestSpec]:
    """`sample_requests` of a profile with session classes: whole cycles of its open
    phases, each session's turns flattened (`flatten_turn`) at its start, in time order;
    single-turn requests numbered as `sample_requests` numbers them."""
    period = float(sum(durations))
    found: list[tuple[float, int, RequestSpec]] = []
    session_classes = np.array([c.session is not None for c in profile.classes])
    singles = sessions = cycle = 0
    while len(found) < n:
        for i, (start, end) in zip(
            open_phases, _phase_bounds(durations, cycle * period), strict=True
        ):
            requests, drawn = _open_block(
                profile, seed, i, cycle, (start, end), session_classes, singles, sessions
            )
            sessions += len(drawn)
            for session in drawn:
                for turn in session.turns:
                    found.append(
                        (session.start_at, len(found), flatten_turn(turn, session.start_at))
                    )
            for spec in requests:
                found.append((spec.open_at, len(found), spec))
            singles += len(requests)
        cycle += 1
    found.sort(key=lambda f: (f[0], f[1]))
    specs = [spec for _, _, spec in found[:n]]
    for index, spec in enumerate(specs):
        spec.index = index
    return specs
