"""The gate's rules: a TOML file (``ci/gate.toml``; schema in docs/gate.md).

::

    [gate]
    confidence = 0.95        # two-sided confidence of the interval of each difference
    resamples = 1000         # bootstrap resamples (real runs)
    simulated = "exact"      # simulated pairs: "exact" (any change fails) | "rules"

    [[rule]]
    cell = "*"               # a cell (policy or matrix cell) or "*" (every cell)
    class = "short_chat"     # a request class, "all" (every request) or "*" (each class)
    metric = "ttft"          # ttft itl tpot e2e queue stall goodput error_rate step_cost
    percentile = 95          # latency metrics: 0..100 or "mean"
    max_regression = 0.10    # relative: fail when current is worse by more than 10%
    max = 2.0                # absolute ceiling (seconds; error_rate: a fraction)
    min = 1.5                # absolute floor (goodput, requests/s)

Every key is checked: an unknown key, metric, percentile or value is a
:class:`GateConfigError` naming it (the command's exit 2).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.records.request_stats import METRIC_COLUMNS


class GateConfigError(ValueError):
    """A gate configuration that cannot be used; the message names the key."""


#: metric name -> (requests.parquet column, unit, higher is better): every latency by
#: its one name (harness.records.request_stats.METRIC_COLUMNS), then the rates.
METRICS: dict[str, tuple[str, str, bool]] = {
    **{name: (column, "s", False) for name, column in METRIC_COLUMNS.items()},
    "goodput": ("slo_met", "req/s", True),
    "error_rate": ("status", "", False),
}
#: Metrics that are one number per run (no percentile).
RATE_METRICS = ("goodput", "error_rate")
#: The served engine's cost per step, priced over the same batches on both sides
#: (harness/gate/step_cost.py): a relative rule of real served runs, of every request.
STEP_COST = "step_cost"
SIMULATED_MODES = ("exact", "rules")
GATE_KEYS = {"confidence", "resamples", "seed", "simulated", "num_blocks"}
RULE_KEYS = {"name", "cell", "class", "metric", "percentile", "max_regression", "max", "min"}
LIMIT_KEYS = ("max_regression", "max", "min")
ALL_REQUESTS = "all"
EVERY = "*"


@dataclass(frozen=True)
class Rule:
    """One line of the gate: ``metric`` (at ``percentile``) of ``klass`` in ``cell``."""

    name: str
    cell: str
    klass: str
    metric: str
    percentile: float | None  # None: the mean (latency) or a rate metric
    max_regression: float | None = None
    max: float | None = None
    min: float | None = None

    @property
    def higher_is_better(self) -> bool:
        return False if self.metric == STEP_COST else METRICS[self.metric][2]

    @property
    def statistic(self) -> str:
        """``p95``, ``mean`` or ``rate``: how the metric is summarised."""
        if self.metric in RATE_METRICS or self.metric == STEP_COST:
            return "rate"
        if self.percentile is None:
            return "mean"
        return f"p{self.percentile:g}"

    @property
    def label(self) -> str:
        return f"{self.metric} {self.statistic}" if self.statistic != "rate" else self.metric


@dataclass(frozen=True)
class GateConfig:
    rules: tuple[Rule, ...]
    confidence: float = 0.95
    resamples: int = 1000
    seed: int = 20260101
    num_blocks: int = 40
    simulated: str = "exact"
    source: str = "(defaults)"
    extra: dict = field(default_factory=dict)


def _number(key: str, value, *, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GateConfigError(f"{key}: expected a number, got {value!r}")
    if low is not None and value < low or high is not None and value > high:
        raise GateConfigError(f"{key}: {value!r} is outside [{low}, {high}]")
    return float(value)


def _text(key: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise GateConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _rule(index: int, table) -> Rule:
    where = f"rule[{index}]"
    if not isinstance(table, dict):
        raise GateConfigError(f"{where}: expected a table")
    unknown = sorted(set(table) - RULE_KEYS)
    if unknown:
        raise GateConfigError(
            f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(RULE_KEYS))})"
        )
    if "metric" not in table:
        raise GateConfigError(f"{where}.metric: missing")
    metric = _text(f"{where}.metric", table["metric"])
    if metric not in METRICS and metric != STEP_COST:
        raise GateConfigError(
            f"{where}.metric: unknown metric {metric!r} (known: {', '.join(METRICS)}, {STEP_COST})"
        )
    percentile: float | None = None
    if metric == STEP_COST:
        _step_cost_rule(where, table)
    elif metric in RATE_METRICS:
        if "percentile" in table:
            raise GateConfigError(f"{where}.percentile: {metric} is a rate, it has no percentile")
    else:
        value = table.get("percentile", 95)
        if value != "mean":
            percentile = _number(f"{where}.percentile", value, low=0, high=100)
    limits = {k: table[k] for k in LIMIT_KEYS if k in table}
    if not limits:
        raise GateConfigError(f"{where}: give at least one of {', '.join(LIMIT_KEYS)}")
    checked = {k: _number(f"{where}.{k}", v, low=0) for k, v in limits.items()}
    if "min" in checked and metric != "goodput":
        raise GateConfigError(f"{where}.min: a floor applies to goodput only (metric {metric})")
    if "max" in checked and metric == "goodput":
        raise GateConfigError(f"{where}.max: goodput takes a floor (min), not a ceiling")
    if metric == "error_rate" and "max" in checked and checked["max"] > 1:
        raise GateConfigError(f"{where}.max: error_rate is a fraction in [0, 1]")
    cell = _text(f"{where}.cell", table.get("cell", EVERY))
    klass = _text(f"{where}.class", table.get("class", ALL_REQUESTS))
    rule = Rule(
        name=_text(f"{where}.name", table.get("name", f"rule{index + 1}")),
        cell=cell,
        klass=klass,
        metric=metric,
        percentile=percentile,
        **checked,
    )
    return rule


def _step_cost_rule(where: str, table: dict) -> None:
    """A step_cost rule compares two sides' steps, of every request: a relative
    tolerance only, no percentile, no class."""
    for key in ("percentile", "max", "min"):
        if key in table:
            raise GateConfigError(
                f"{where}.{key}: {STEP_COST} is a relative change of the cost per step; it "
                "takes max_regression only"
            )
    if table.get("class", ALL_REQUESTS) != ALL_REQUESTS:
        raise GateConfigError(
            f"{where}.class: {STEP_COST} is of every step, not of a class (leave class out)"
        )


def parse_config(data: dict, source: str = "(inline)") -> GateConfig:
    """A :class:`GateConfig` from the TOML document ``data``."""
    unknown = sorted(set(data) - {"gate", "rule"})
    if unknown:
        raise GateConfigError(f"{unknown[0]}: unknown top-level key (known: gate, rule)")
    gate = data.get("gate", {})
    if not isinstance(gate, dict):
        raise GateConfigError("gate: expected a table")
    bad = sorted(set(gate) - GATE_KEYS)
    if bad:
        raise GateConfigError(f"gate.{bad[0]}: unknown key (known: {', '.join(sorted(GATE_KEYS))})")
    options: dict = {}
    if "confidence" in gate:
        options["confidence"] = _number("gate.confidence", gate["confidence"], low=0.5, high=0.999)
    for key, low in (("resamples", 100), ("num_blocks", 5)):
        if key in gate:
            value = gate[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GateConfigError(f"gate.{key}: expected an integer >= {low}, got {value!r}")
            options[key] = value
    if "seed" in gate:
        if isinstance(gate["seed"], bool) or not isinstance(gate["seed"], int):
            raise GateConfigError(f"gate.seed: expected an integer, got {gate['seed']!r}")
        options["seed"] = gate["seed"]
    if "simulated" in gate:
        if gate["simulated"] not in SIMULATED_MODES:
            raise GateConfigError(
                f"gate.simulated: expected one of {', '.join(SIMULATED_MODES)}, "
                f"got {gate['simulated']!r}"
            )
        options["simulated"] = gate["simulated"]
    rules = data.get("rule", [])
    if not isinstance(rules, list) or not rules:
        raise GateConfigError("rule: give at least one [[rule]]")
    parsed = tuple(_rule(i, t) for i, t in enumerate(rules))
    names = [r.name for r in parsed]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise GateConfigError(f"rule.name: {duplicate!r} is used twice")
    return GateConfig(rules=parsed, source=source, **options)


def load_config(path: Path | str) -> GateConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise GateConfigError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise GateConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_config(data, str(path))
    except GateConfigError as exc:
        raise GateConfigError(f"{path}: {exc}") from None


#: Without ``--config``: p95 TTFT and E2E of every class may not regress by more than
#: 10%, and no cell may fail more than 1% of its requests.
DEFAULT_RULES = {
    "rule": [
        {"name": "ttft_p95", "class": EVERY, "metric": "ttft", "max_regression": 0.10},
        {"name": "e2e_p95", "class": EVERY, "metric": "e2e", "max_regression": 0.10},
        {"name": "errors", "metric": "error_rate", "max": 0.01},
    ]
}


def default_config() -> GateConfig:
    return parse_config(DEFAULT_RULES, "(built-in defaults)")
