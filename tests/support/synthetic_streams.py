"""A continuous-batching engine written for the tests, independent of the bundled one: it
runs requests on a cost model's clock, FCFS, decodes before prefills under a token budget
(vLLM V1's order), and says what a streaming client would see (each request's first
token time and its gaps) and what really ran (each step's start, end and features). The
tests of ``harness.calibration.stream_steps`` compare what it rebuilds from the former
with the latter."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.cost_model import CostModel, step_features


@dataclass
class Request:
    arrival: float
    prompt: int
    output: int
    cached: int = 0
    # state
    computed: int = 0
    emitted: int = 0
    token_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class TrueStep:
    start: float
    end: float
    features: tuple[float, ...]
    requests: frozenset[int]


def run(
    requests: list[Request],
    model: CostModel,
    budget: int = 2048,
    max_seqs: int = 64,
    jitter=None,
) -> tuple[list[float | None], list[list[float]], list[TrueStep]]:
    """(first token times, gaps per request, the steps that ran). ``jitter(i, k)`` adds
    a delivery delay to the k-th token of request i (default none)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    waiting = list(order)
    running: list[int] = []
    steps: list[TrueStep] = []
    t = 0.0
    while waiting or running:
        if not running and waiting and requests[waiting[0]].arrival > t:
            t = requests[waiting[0]].arrival
        while waiting and requests[waiting[0]].arrival <= t and len(running) < max_seqs:
            i = waiting.pop(0)
            requests[i].computed = min(requests[i].cached, requests[i].prompt - 1)
            running.append(i)
        decodes = [i for i in running if requests[i].computed >= requests[i].prompt]
        room = budget - len(decodes)
        prefill_tokens = prefill_seqs = attention = 0
        finishing_prefill = []
        for i in running:
            r = requests[i]
            if r.computed >= r.prompt or room <= 0:
                continue
            chunk = min(r.prompt - r.computed, room)
            room -= chunk
            r.computed += chunk
            prefill_tokens += chunk
            prefill_seqs += 1
            attention += chunk * r.computed
            if r.computed == r.prompt:
                finishing_prefill.append(i)
        context = sum(requests[i].prompt + requests[i].emitted for i in decodes)
        features = step_features(
            prefill_tokens, len(decodes), context, attention, 0, prefill_seqs, 0
        )
        end = t + model.predict_features(features)
        members = set()
        for i in decodes + finishing_prefill:
            r = requests[i]
            r.emitted += 1
            r.token_times.append(end)
            members.add(i)
        steps.append(TrueStep(t, end, tuple(features), frozenset(members)))
        running = [i for i in running if requests[i].emitted < requests[i].output]
        t = end
    firsts: list[float | None] = []
    gaps: list[list[float]] = []
    for i, r in enumerate(requests):
        seen = [time + (jitter(i, k) if jitter else 0.0) for k, time in enumerate(r.token_times)]
        seen = sorted(seen)
        firsts.append(seen[0] if seen else None)
        gaps.append([b - a for a, b in zip(seen, seen[1:], strict=False)])
    return firsts, gaps, steps
