"""Each rule applied to each of its cells and classes: one :class:`Check` per line.

How a line is decided (docs/gate.md, "Method"):

- ``max`` / ``min`` (absolute): the current run's value against the limit.
- ``max_regression`` between two simulated runs: they are deterministic, so the
  relative change is compared exactly with the tolerance.
- ``max_regression`` between real runs: the relative change (current / baseline - 1,
  sign turned so that positive is worse) gets a confidence interval from the report's
  paired block bootstrap (:func:`harness.report.stats.paired_block_bootstrap`): the
  requests of both runs are cut into the same windows of schedule offset, and each
  resample draws windows with replacement for both runs at once. The line fails only
  when the whole interval lies above the tolerance: a regression the noise cannot
  explain.
- ``simulated = "exact"``: two simulated runs must also agree on every request
  (status, output tokens, every latency), or the change must come with a new baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from harness.gate.config import ALL_REQUESTS, EVERY, METRICS, STEP_COST, GateConfig, Rule
from harness.gate.sides import CENSORED_COLUMN, RUN_COLUMN, CellData, GateInputError, Side
from harness.records.request_stats import CENSORED_METRICS
from harness.report.stats import (
    MIN_SHARED_BLOCKS,
    paired_block_bootstrap,
    percentile,
    time_blocks,
    weighted_percentile,
)

#: Columns two simulated runs must agree on, request by request.
EXACT_COLUMNS = ("status", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "queue_s", "stall_s")
#: The keys of a summary.json group (``overall``, ``classes.<class>``; dotted below it)
#: one side may have and the other lack, legitimately, in the exact comparison of two
#: summary.json: the report's own group keys, which version 1 (a run's) lacks
#: (harness/report/tables.py, ``group_stats``), and the ones version 1 gained in a
#: later release, which an older summary.json lacks (docs/records.md). Left out where one
#: side lacks them; every other key on one side only fails the line, named.
ONE_SIDED_KEYS = frozenset(
    {
        "itl_s",  # version 2: every inter-token gap
        "stall_time_s",  # version 2: the report's stall attribution
        "stalls_by_cause",  # version 2
        "generator_lag_s",  # version 2: sent_at - scheduled_at
        "slo_met",  # version 1 since a later release
        "metrics.total_queue_s",  # version 1 since a later release
    }
)


@dataclass
class Check:
    rule: str
    cell: str
    klass: str
    metric: str  # "ttft p95", "goodput", "results"
    kind: str  # "regression" | "ceiling" | "floor" | "exact"
    limit: float | None
    baseline: float | None
    current: float | None
    change: float | None  # relative, positive = worse (regression lines)
    interval: tuple[float, float] | None
    method: str  # "exact" | "bootstrap" | "point"
    passed: bool
    message: str
    #: the baseline has no value for this line (no finished request of the class):
    #: nothing to compare, so neither pass nor fail (a gate whose every line is so is a
    #: data error, exit 2)
    inconclusive: bool = False

    @property
    def status(self) -> str:
        if self.inconclusive:
            return "n/a"
        return "pass" if self.passed else "FAIL"


def tolerance_text(fraction: float) -> str:
    """0.1 -> "10%", 0.025 -> "2.5%": a tolerance as written, not rounded away."""
    return f"{fraction * 100:.2f}".rstrip("0").rstrip(".") + "%"


# -- values and statistics ---------------------------------------------------------------


def _rows(cell: CellData, klass: str) -> pl.DataFrame:
    assert cell.frame is not None
    return cell.frame if klass == ALL_REQUESTS else cell.frame.filter(pl.col("class") == klass)


def _series(rule: Rule, cell: CellData, klass: str, estimate_itl: bool = False):
    """(values, schedule offsets, statistic, runs) of ``rule``'s metric over the rows;
    ``runs`` (which run of a pooled cell each value came from) is None for one run.

    ``values`` is what the bootstrap resamples: one entry per request, or per gap for
    ITL measured by the client; ITL without client gaps is estimated as the report does
    (each request's TPOT weighted by its number of gaps: rows of (tpot, weight)), and so
    is every ITL when ``estimate_itl`` (one side lacks client gaps: both sides then use
    the one estimate)."""
    rows = _rows(cell, klass)
    column = METRICS[rule.metric][0]
    if rule.metric == "goodput":
        # Each request counts 1 / its own run's duration, so that one statistic (the sum)
        # is each side's goodput whatever their durations or numbers of repeats.
        duration = cell.duration_s  # > 0: check_rows
        values = rows["slo_met"].cast(pl.Float64).fill_null(0.0).to_numpy() / duration
        return values, rows["offset_s"].to_numpy(), lambda v: float(v.sum()), _runs(rows)
    if rule.metric == "error_rate":
        values = (rows["status"] != "ok").cast(pl.Float64).to_numpy()
        statistic = lambda v: float(v.mean()) if v.size else None  # noqa: E731
        return values, rows["offset_s"].to_numpy(), statistic, _runs(rows)
    ok = rows.filter(pl.col("status") == "ok")
    if rule.metric == "itl":
        keep = ["offset_s", "itl_s", *([RUN_COLUMN] if RUN_COLUMN in ok.columns else [])]
        gaps = ok.select(keep).explode("itl_s").drop_nulls("itl_s")
        if gaps.height and not estimate_itl:
            values, offsets, present = gaps["itl_s"].to_numpy(), gaps["offset_s"].to_numpy(), gaps
        else:
            est = ok.drop_nulls("tpot_s").filter(pl.col("output_tokens") > 1)
            weights = (est["output_tokens"] - 1).cast(pl.Float64).to_numpy()
            values = np.column_stack([est["tpot_s"].to_numpy(), weights])
            return values, est["offset_s"].to_numpy(), _weighted_statistic(rule), _runs(est)
    else:
        if column in CENSORED_METRICS and CENSORED_COLUMN in rows.columns:
            # cut requests at their lower bounds, never dropped (sides.CENSORED_COLUMN)
            ok = rows.filter((pl.col("status") == "ok") | pl.col(CENSORED_COLUMN))
        present = ok.drop_nulls(column)
        values, offsets = present[column].to_numpy(), present["offset_s"].to_numpy()
    return np.asarray(values, dtype=float), offsets, _statistic(rule), _runs(present)


def num_censored(rule: Rule, cell: CellData, klass: str) -> int:
    """How many of the class's requests entered ``rule``'s metric at a lower bound (cut
    in flight by the end of the run); 0 for a metric they do not bound."""
    if cell.frame is None or CENSORED_COLUMN not in cell.frame.columns:
        return 0
    if METRICS[rule.metric][0] not in CENSORED_METRICS:
        return 0
    return int(_rows(cell, klass)[CENSORED_COLUMN].sum())


def _censoring(passed: bool, message: str, current: int, baseline: int) -> tuple[bool, str]:
    """A line's outcome with cut requests on either side (their values are lower
    bounds): a pass cannot be shown when the current run's value is a lower bound; a
    regression against a baseline whose value is one may be smaller than shown."""
    if current and passed:
        return False, (
            f"{message}; but {current} request(s) of the current run were cut in flight, so "
            "its value is a lower bound: a pass cannot be shown (wait for them: --grace)"
        )
    if current:
        message += f" ({current} cut request(s) in the current run: its value is at least this)"
    if baseline and not passed:
        message += (
            f" ({baseline} request(s) of the baseline were cut in flight: its value is a lower "
            "bound, and the regression may be smaller than shown)"
        )
    return passed, message


def _runs(frame: pl.DataFrame) -> np.ndarray | None:
    """Which run each row came from, for a cell pooled from several; else None."""
    if RUN_COLUMN not in frame.columns or frame[RUN_COLUMN].n_unique() < 2:
        return None
    return frame[RUN_COLUMN].to_numpy()


def _statistic(rule: Rule):
    if rule.percentile is None:
        return lambda v: float(v.mean()) if v.size else None
    p = rule.percentile
    return lambda v: percentile(v, p)


def _weighted_statistic(rule: Rule):
    if rule.percentile is None:
        return lambda v: float(np.average(v[:, 0], weights=v[:, 1])) if v.size else None
    p = rule.percentile
    return lambda v: weighted_percentile(v[:, 0], v[:, 1], p) if v.size else None


def _summary_value(rule: Rule, cell: CellData, klass: str) -> float | None:
    """The value from a summary.json group (percentiles it holds: 50, 90, 95, 99)."""
    summary = cell.summary or {}
    group = (
        summary.get("overall") if klass == ALL_REQUESTS else summary.get("classes", {}).get(klass)
    )
    if group is None:
        raise GateInputError(f"cell {cell.name}: no class {klass!r} in its summary.json")
    if rule.metric == "goodput":
        return group.get("goodput_rps")
    if rule.metric == "error_rate":
        total = group.get("requests") or 0
        return 1 - (group.get("counts", {}).get("ok", 0) / total) if total else None
    column = METRICS[rule.metric][0]
    dist = group.get("itl_s") if rule.metric == "itl" else group.get("metrics", {}).get(column)
    if dist is None:
        raise GateInputError(f"cell {cell.name}: its summary.json has no {column} ({rule.name})")
    key = "mean" if rule.percentile is None else f"p{rule.percentile:g}"
    if key not in dist and dist.get("count", 1):
        raise GateInputError(
            f"rule {rule.name}: summary.json holds p50/p90/p95/p99 and the mean, not {key}; "
            "gate run directories for other percentiles"
        )
    return dist.get(key)


def _relative(rule: Rule, current: float | None, baseline: float | None) -> float | None:
    """Relative change, positive when worse; None when undefined (a zero baseline)."""
    if current is None or baseline is None:
        return None
    if baseline == 0:
        return 0.0 if current == 0 else None
    change = current / baseline - 1
    return -change if rule.higher_is_better else change


# -- the lines ---------------------------------------------------------------------------


def _cells(rule: Rule, baseline: Side, current: Side) -> list[str]:
    names = sorted(set(baseline.cells) | set(current.cells)) if rule.cell == EVERY else [rule.cell]
    for name in names:
        for side, what in ((baseline, "baseline"), (current, "current")):
            if name not in side.cells:
                raise GateInputError(
                    f"rule {rule.name}: cell {name!r} is missing from the {what} "
                    f"({side.path}; it has {', '.join(sorted(side.cells)) or 'none'})"
                )
    return names


def _classes_of(cell: CellData) -> set[str]:
    if cell.frame is not None:
        return set(cell.frame["class"].fill_null("default").unique().to_list())
    return set((cell.summary or {}).get("classes", {}))


def _classes(rule: Rule, name: str, baseline: Side, current: Side) -> list[str]:
    a, b = _classes_of(baseline.cells[name]), _classes_of(current.cells[name])
    wanted = sorted(a | b) if rule.klass == EVERY else [rule.klass]
    for klass in wanted:
        if klass == ALL_REQUESTS:
            continue
        for present, side, what in ((a, baseline, "baseline"), (b, current, "current")):
            if klass not in present:
                raise GateInputError(
                    f"rule {rule.name}: class {klass!r} is missing from cell {name} of the "
                    f"{what} ({side.path}; it has {', '.join(sorted(present)) or 'none'})"
                )
    return wanted


def _has_gaps(cell: CellData) -> bool:
    return cell.frame is not None and cell.frame["itl_s"].list.len().fill_null(0).sum() > 0


def _value(rule: Rule, cell: CellData, klass: str, estimate_itl: bool = False) -> float | None:
    if cell.frame is None:
        return _summary_value(rule, cell, klass)
    values, _, statistic, _ = _series(rule, cell, klass, estimate_itl)
    return statistic(values) if len(values) else None


def _absolute(rule: Rule, name: str, klass: str, current: CellData, baseline_value) -> list[Check]:
    out = []
    value = _value(rule, current, klass)
    for kind, limit in (("ceiling", rule.max), ("floor", rule.min)):
        if limit is None:
            continue
        if value is None:
            passed, message = False, "no value in the current run (no finished request)"
        elif kind == "ceiling":
            passed = value <= limit
            message = f"{value:.6g} {'<=' if passed else '>'} ceiling {limit:g}"
        else:
            passed = value >= limit
            message = f"{value:.6g} {'>=' if passed else '<'} floor {limit:g}"
        if kind == "ceiling" and value is not None:
            passed, message = _censoring(passed, message, num_censored(rule, current, klass), 0)
        out.append(
            Check(
                rule.name,
                name,
                klass,
                rule.label,
                kind,
                limit,
                baseline_value,
                value,
                None,
                None,
                "point",
                passed,
                message,
            )
        )
    return out


def _regression(
    rule: Rule, name: str, klass: str, baseline: Side, current: Side, config: GateConfig
) -> Check:
    tolerance = rule.max_regression
    assert tolerance is not None
    a, b = current.cells[name], baseline.cells[name]
    exact = baseline.simulated and current.simulated
    if not exact and (a.frame is None or b.frame is None):
        raise GateInputError(
            f"rule {rule.name}: a relative rule between real runs needs per-request data; "
            "pass run directories or baseline files, not summary.json"
        )
    estimate = rule.metric == "itl" and not (_has_gaps(a) and _has_gaps(b))
    value_a, value_b = _value(rule, a, klass, estimate), _value(rule, b, klass, estimate)
    change = _relative(rule, value_a, value_b)
    if exact or a.frame is None or b.frame is None:
        interval = None if change is None else (change, change)
        method = "exact"
    else:
        interval = _interval(rule, a, b, klass, config, estimate)
        method = "bootstrap"
    if value_b is None:
        # Nothing to compare with: this line says so and passes nothing; a class that
        # finished nothing in the baseline (starved under FCFS, say) must not block the
        # gate's other lines. A gate with no comparable line at all is exit 2 (evaluate).
        return Check(
            rule.name, name, klass, rule.label, "regression", tolerance, None, value_a,
            None, None, "none", True,
            f"no comparison: the baseline ({baseline.path}) has no {rule.label} of this "
            "class (no finished request)",
            inconclusive=True,
        )  # fmt: skip
    if value_a is None:
        # The current run has rows but none finished: what the change did (exit 1).
        passed, message = False, "no finished request of this class in the current run"
    elif change is None:
        passed = False
        message = f"baseline is 0 and current {value_a:.6g}: a relative change is undefined"
    elif interval is None:
        passed = False
        message = "too few requests for an interval of the change"
    else:
        passed = interval[0] <= tolerance
        if method == "exact":
            message = (
                f"{change:+.2%} {'<=' if passed else '>'} tolerance {tolerance_text(tolerance)}"
            )
        elif passed and interval[1] > tolerance:
            message = (
                f"{change:+.2%}, interval [{interval[0]:+.2%}, {interval[1]:+.2%}] reaches "
                f"past the tolerance {tolerance_text(tolerance)}: within noise, not a proven "
                "regression"
            )
        else:
            message = (
                f"{change:+.2%}, interval [{interval[0]:+.2%}, {interval[1]:+.2%}] "
                f"{'clears' if not passed else 'below'} tolerance {tolerance_text(tolerance)}"
            )
    passed, message = _censoring(
        passed, message, num_censored(rule, a, klass), num_censored(rule, b, klass)
    )
    return Check(
        rule.name,
        name,
        klass,
        rule.label,
        "regression",
        tolerance,
        value_b,
        value_a,
        change,
        interval,
        method,
        passed,
        message,
    )


def _step_cost(rule: Rule, name: str, baseline: Side, current: Side, config: GateConfig) -> Check:
    """The step-cost line of cell ``name`` (harness/gate/step_cost.py)."""
    from harness.gate import step_cost

    tolerance = rule.max_regression
    assert tolerance is not None
    if baseline.simulated:
        return Check(
            rule.name, name, ALL_REQUESTS, rule.label, "regression", tolerance, None, None,
            None, None, "none", True,
            "no comparison: simulated steps take what the cost model prices them at, so "
            "their cost cannot regress (the exact comparison sees a scheduling change)",
            inconclusive=True,
        )  # fmt: skip
    sides = ((baseline, "baseline"), (current, "current"))
    for side, what in sides:
        if not side.cells[name].steps:
            raise GateInputError(
                f"rule {rule.name}: {STEP_COST} needs the served engine's step records "
                f"(steps.parquet) of every run of cell {name} on both sides; the {what} "
                f"({side.path}) has none (a --target run, a simulation, a baseline file or "
                "a summary.json records no steps)"
            )
    result = step_cost.step_cost_change(
        step_cost.read_step_runs(baseline.cells[name].steps),
        step_cost.read_step_runs(current.cells[name].steps),
        confidence=config.confidence,
        resamples=config.resamples,
        num_blocks=config.num_blocks,
        seed=config.seed,
    )
    low, high = result.interval
    passed = low <= tolerance
    how = (
        f"{result.current_cycles} steps against {result.baseline_cycles}, priced alike; "
        f"runs drawn {result.runs_drawn}"
    )
    if passed and high > tolerance:
        verdict = f"reaches past the tolerance {tolerance_text(tolerance)}: within noise"
    else:
        verdict = f"{'clears' if not passed else 'below'} tolerance {tolerance_text(tolerance)}"
    message = (
        f"{result.change:+.2%}, interval [{low:+.2%}, {high:+.2%}] {verdict} "
        f"(each step took {result.current_ratio:.3f}x the reference price against "
        f"{result.baseline_ratio:.3f}x; {how})"
    )
    return Check(
        rule.name, name, ALL_REQUESTS, rule.label, "regression", tolerance,
        result.baseline_ratio, result.current_ratio, result.change, result.interval,
        "bootstrap", passed, message,
    )  # fmt: skip


def _interval(
    rule: Rule, a: CellData, b: CellData, klass: str, config: GateConfig, estimate_itl: bool
):
    va, oa, statistic, ra = _series(rule, a, klass, estimate_itl)
    vb, ob, _, rb = _series(rule, b, klass, estimate_itl)
    if len(va) == 0 or len(vb) == 0:
        return None
    both = np.concatenate([oa, ob])
    start, end = float(both.min()), float(both.max())
    higher = rule.higher_is_better

    def contrast(current: float, baseline: float) -> float | None:
        if baseline == 0:
            return 0.0 if current == 0 else None
        change = current / baseline - 1
        return -change if higher else change

    # (values, blocks) or, with several runs on a side, (values, blocks, runs)
    side_a: tuple = (va, time_blocks(oa, start, end, config.num_blocks))
    side_b: tuple = (vb, time_blocks(ob, start, end, config.num_blocks))
    if ra is not None or rb is not None:  # several runs on a side: resample runs too
        side_a, side_b = (*side_a, ra), (*side_b, rb)
    ci = paired_block_bootstrap(
        side_a,
        side_b,
        statistic,
        num_blocks=config.num_blocks,
        resamples=config.resamples,
        seed=config.seed,
        confidence=config.confidence,
        contrast=contrast,
        # fewer shared windows make an interval of one repeated value ([+50%, +50%] from
        # one request a side), which 'clears' any tolerance: no interval, a FAIL saying so
        min_shared_blocks=MIN_SHARED_BLOCKS,
    )
    return ci


def _exact_results(name: str, baseline: CellData, current: CellData) -> Check:
    """Two simulated cells: the same outcome for every request, or a failing line."""
    if baseline.frame is None or current.frame is None:
        left, right, one_sided = _aligned(
            _summary_groups(baseline.summary), _summary_groups(current.summary)
        )
        counted = None
        if one_sided:
            same = False
            named = ", ".join(f"{key} (only the {side})" for key, side in one_sided[:5])
            more = f" and {len(one_sided) - 5} more" if len(one_sided) > 5 else ""
            detail = f"summary.json keys on one side only: {named}{more}"
        else:
            same = left == right
            detail = (
                "summary.json statistics identical" if same else "summary.json statistics differ"
            )
    else:
        a = baseline.frame.select("request_id", *EXACT_COLUMNS).sort(
            "request_id", maintain_order=True
        )
        b = current.frame.select("request_id", *EXACT_COLUMNS).sort(
            "request_id", maintain_order=True
        )
        if a["request_id"].to_list() != b["request_id"].to_list():
            same, counted = False, None
            detail = "the two runs hold different requests"
        else:
            differs = np.zeros(a.height, dtype=bool)
            for column in EXACT_COLUMNS:
                x, y = a[column].to_list(), b[column].to_list()
                differs |= np.array(
                    [not _equal(p, q) for p, q in zip(x, y, strict=True)], dtype=bool
                )
            counted = int(differs.sum())
            same = counted == 0
            if same:
                detail = f"all {a.height} requests identical"
            else:
                first = a["request_id"][int(np.argmax(differs))]
                detail = f"{counted} of {a.height} requests differ (first: {first})"
    message = detail if same else f"{detail}: if intended, update the baseline in this change"
    return Check(
        "simulated_exact",
        name,
        ALL_REQUESTS,
        "results",
        "exact",
        0.0,
        None,
        None if counted is None else float(counted),
        None,
        None,
        "exact",
        same,
        message,
    )


def _equal(p, q) -> bool:
    if isinstance(p, float) and isinstance(q, float):
        return p == q or (math.isnan(p) and math.isnan(q))
    return p == q


def _summary_groups(summary: dict | None) -> dict:
    summary = summary or {}
    return {"overall": summary.get("overall"), "classes": summary.get("classes")}


def _group_key(path: tuple[str, ...]) -> str:
    """``path`` (from :func:`_summary_groups`'s top) below its group, dotted: what
    :data:`ONE_SIDED_KEYS` names."""
    if path[:1] == ("overall",):
        return ".".join(path[1:])
    if path[:1] == ("classes",) and len(path) > 2:
        return ".".join(path[2:])
    return ""  # a group itself (a class), or the top: never one-sided legitimately


def _aligned(a, b, path: tuple[str, ...] = ()) -> tuple:
    """(``a``, ``b``, one-sided): the two cut to the keys both have, at every level, and
    (dotted key, "baseline" | "current") for each key only one side has, except those of
    :data:`ONE_SIDED_KEYS` (a version-2 summary carries keys version 1 lacks)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return a, b, []
    left, right, one_sided = {}, {}, []
    for key in sorted(set(a) | set(b), key=str):
        here = (*path, str(key))
        if key in a and key in b:
            left[key], right[key], below = _aligned(a[key], b[key], here)
            one_sided += below
        elif _group_key(here) not in ONE_SIDED_KEYS:
            one_sided.append((".".join(here), "baseline" if key in a else "current"))
    return left, right, one_sided


def check_usable(side: Side, what: str, config: GateConfig | None = None) -> None:
    """A generator-limited cell measured the load generator, not the engine: exit 2 —
    unless every rule is a step-cost rule (``config``): the engine's steps are timed by
    the engine, and with the load generator on cores of its own (--cpu-split) its lag
    shifts arrivals but does not price the steps."""
    if config is not None and all(rule.metric == STEP_COST for rule in config.rules):
        return
    for name, cell in side.cells.items():
        if cell.generator_limited:
            lag = cell.send_lag_p99_s
            said = f" (p99 send lag {lag * 1e3:.1f} ms)" if lag is not None else ""
            raise GateInputError(
                f"the {what} cell {name} is generator-limited{said}: the load generator fell "
                "behind its schedule, so its latencies are not the engine's; rerun it with "
                "more load-generator processes or a lower rate"
            )


def check_rows(config: GateConfig, side: Side, what: str) -> None:
    """A cell with no request at all cannot be gated, on either side (exit 2): it says
    nothing about the engine, and every line of it would be "no value". Nor can goodput
    be without the cell's duration (a rate over an unknown span)."""
    goodput = any(rule.metric == "goodput" for rule in config.rules)
    for name, cell in side.cells.items():
        requests: int | None
        if cell.frame is not None:
            requests = cell.frame.height
        else:
            requests = ((cell.summary or {}).get("overall") or {}).get("requests")
        if requests == 0:
            raise GateInputError(
                f"the {what} ({side.path}) cell {name} has no request rows: nothing to gate"
            )
        if goodput and cell.frame is not None and not cell.duration_s > 0:
            raise GateInputError(
                f"the {what} ({side.path}) cell {name} has no known duration (0 s): its "
                "goodput (requests/s) cannot be computed"
            )


def evaluate(config: GateConfig, baseline: Side, current: Side) -> list[Check]:
    """Every line of the gate, in rule order (then cell, then class)."""
    if baseline.simulated != current.simulated:
        raise GateInputError(
            f"the baseline is {'simulated' if baseline.simulated else 'real'} and the current "
            f"run {'simulated' if current.simulated else 'real'}: gate like with like"
        )
    check_usable(baseline, "baseline", config)
    check_usable(current, "current", config)
    check_rows(config, baseline, "baseline")
    check_rows(config, current, "current")
    checks: list[Check] = []
    for rule in config.rules:
        for name in _cells(rule, baseline, current):
            if rule.metric == STEP_COST:
                checks.append(_step_cost(rule, name, baseline, current, config))
                continue
            for klass in _classes(rule, name, baseline, current):
                if rule.max_regression is not None:
                    checks.append(_regression(rule, name, klass, baseline, current, config))
                if rule.max is not None or rule.min is not None:
                    base_value = _value(rule, baseline.cells[name], klass)
                    checks += _absolute(rule, name, klass, current.cells[name], base_value)
    if config.simulated == "exact" and baseline.simulated and current.simulated:
        if baseline.kind != current.kind:
            raise GateInputError(
                'simulated = "exact" compares like with like: both sides run directories '
                "(or baseline files), or both summary.json"
            )
        for name in sorted(set(baseline.cells) & set(current.cells)):
            checks.append(_exact_results(name, baseline.cells[name], current.cells[name]))
    compared = [c for c in checks if c.kind == "regression"]
    if compared and all(c.inconclusive for c in compared):
        raise GateInputError(
            f"the baseline ({baseline.path}) has no value for any line it is compared on "
            "(no finished request): nothing to compare with; record the baseline again "
            "from a run whose requests finish"
        )
    return checks
