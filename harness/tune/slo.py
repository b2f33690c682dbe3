"""The ``--slo`` targets of ``schedscope tune``: what "meets its SLOs" means per class.

``--slo "short_chat:ttft_p95<=0.5s,e2e_p99<=20s"``: a class, a colon, then targets
separated by commas. A target is ``<metric>_<statistic><=<limit>[s|ms]``: metric by
its one name (:data:`harness.records.request_stats.METRIC_COLUMNS`: ``ttft``, ``tpot``,
``e2e``, ``max_itl`` (the request's longest gap), ``queue``, ``total_queue``,
``stall``; not ``itl``, every gap, which a simulated summary does not keep); statistic
``p50``, ``p90``, ``p95``, ``p99`` (the percentiles every summary.json carries),
``mean`` or ``max``; the limit in seconds (``s``, the default) or milliseconds
(``ms``).

A class meets its targets when every one of its requests finished ``ok`` (a rejected or
failed request missed its latency) and each statistic, over its requests as
:func:`harness.records.summary.group_summary` computes it, is within the limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.records.request_stats import LATENCY_METRICS, METRIC_COLUMNS, STATISTICS

#: --slo metric name -> the requests.parquet / summary.json column: the latencies a
#: summary.json group holds as distributions.
METRICS = {name: column for name, column in METRIC_COLUMNS.items() if column in LATENCY_METRICS}
_TARGET = re.compile(
    r"^(?P<metric>[a-z0-9_]+?)_(?P<stat>[a-z0-9]+)\s*<=\s*(?P<value>[^a-z]+)(?P<unit>[a-z]*)$"
)


class SloError(ValueError):
    """A --slo value that cannot be parsed or does not fit the profile; the message
    names the part that is wrong."""


@dataclass(frozen=True)
class Target:
    """One latency target of one class: ``statistic`` of ``metric`` <= ``limit_s``."""

    class_name: str
    metric: str  # the --slo name: ttft, tpot, e2e, max_itl, queue, total_queue, stall
    statistic: str  # p50, p90, p95, p99, mean, max
    limit_s: float

    @property
    def column(self) -> str:
        return METRICS[self.metric]

    @property
    def name(self) -> str:
        """``ttft_p95``: the target's name in tables and tune.json."""
        return f"{self.metric}_{self.statistic}"

    def spec(self) -> str:
        return f"{self.name}<={self.limit_s:g}s"

    def value(self, class_summary: dict) -> float | None:
        """The statistic in one class's :func:`harness.records.summary.group_summary`; None when
        the class has no finished request with this metric."""
        return (class_summary.get("metrics", {}).get(self.column) or {}).get(self.statistic)


def parse_slo(text: str) -> list[Target]:
    """One ``--slo`` value as its targets; SloError names what is wrong."""
    if ":" not in text:
        raise SloError(
            f"{text!r}: expected CLASS:TARGET[,TARGET...], e.g. short_chat:ttft_p95<=0.5s"
        )
    class_name, _, rest = text.partition(":")
    class_name = class_name.strip()
    if not class_name:
        raise SloError(f"{text!r}: the class name before ':' is empty")
    parts = [p.strip() for p in rest.split(",")]
    if not rest.strip() or any(not p for p in parts):
        raise SloError(f"{text!r}: an empty target (expected e.g. ttft_p95<=0.5s)")
    targets = [_target(class_name, part) for part in parts]
    names = [t.name for t in targets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SloError(f"{text!r}: {twice[0]} given twice for class {class_name!r}")
    return targets


def _target(class_name: str, part: str) -> Target:
    match = _TARGET.match(part.lower())
    if match is None:
        raise SloError(f"{part!r}: expected METRIC_STAT<=LIMIT (e.g. ttft_p95<=0.5s, e2e_p99<=20s)")
    metric, stat, value, unit = match["metric"], match["stat"], match["value"], match["unit"]
    if metric == "itl":
        raise SloError(
            f"{part!r}: 'itl' is every gap between two tokens, which a simulated summary does "
            "not keep; a request's longest gap is 'max_itl' (e.g. max_itl_p95<=0.2s)"
        )
    if metric not in METRICS:
        raise SloError(f"{part!r}: unknown metric {metric!r}; expected {', '.join(METRICS)}")
    if stat not in STATISTICS:
        raise SloError(f"{part!r}: unknown statistic {stat!r}; expected {', '.join(STATISTICS)}")
    try:
        number = float(value)
    except ValueError:
        raise SloError(f"{part!r}: the limit {value!r} is not a number") from None
    if unit not in ("", "s", "ms"):
        raise SloError(f"{part!r}: unknown unit {unit!r}; expected s or ms")
    if not number > 0 or number == float("inf"):
        raise SloError(f"{part!r}: the limit must be a positive number of seconds")
    return Target(class_name, metric, stat, number / 1000 if unit == "ms" else number)


def parse_slos(values: list[str], class_names: list[str]) -> list[Target]:
    """Every ``--slo`` value, checked against the profile's classes (each class at most
    once). Without any, the profile's own per-request SLOs as p95 targets
    (:func:`profile_targets`)."""
    targets: list[Target] = []
    seen: set[str] = set()
    for text in values:
        parsed = parse_slo(text)
        name = parsed[0].class_name
        if name not in class_names:
            raise SloError(
                f"{text!r}: the profile has no class {name!r} (its classes: "
                f"{', '.join(class_names)})"
            )
        if name in seen:
            raise SloError(f"{text!r}: class {name!r} given in two --slo values; join them")
        seen.add(name)
        targets += parsed
    return targets


def profile_targets(profile) -> list[Target]:
    """The profile's per-request SLOs (``RequestClass.slo``) as p95 targets: what
    ``tune`` checks when no ``--slo`` is given."""
    out = []
    for c in profile.classes:
        for metric, field in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s")):
            limit = getattr(c.slo, field)
            if limit is not None:
                out.append(Target(c.name, metric, "p95", float(limit)))
    return out


def meets(targets: list[Target], classes: dict) -> bool:
    """True when every class with targets finished every request ok and is within each
    of its targets (``classes``: a policy summary's ``classes``)."""
    for t in targets:
        summary = classes.get(t.class_name)
        if summary is None or summary["requests"] == 0:
            return False
        if summary["counts"]["ok"] != summary["requests"]:
            return False
        value = t.value(summary)
        if value is None or value > t.limit_s:
            return False
    return True


def request_slos(targets: list[Target], profile) -> dict[str, dict]:
    """class -> {ttft_s, tpot_s, e2e_s}: the per-request SLOs goodput counts against
    (``--objective goodput``): the profile's, with each --slo target's limit on that
    metric instead where one is given (its statistic ignored: goodput counts requests)."""
    out = {
        c.name: {k: getattr(c.slo, k) for k in ("ttft_s", "tpot_s", "e2e_s")}
        for c in profile.classes
    }
    for t in targets:
        if t.column in ("ttft_s", "tpot_s", "e2e_s"):
            out.setdefault(t.class_name, {})[t.column] = t.limit_s
    return out
