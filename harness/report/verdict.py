"""A verdict per objective, with its margin and whether it exceeds run-to-run noise.

Objectives (within one run, over its policies): ``short_ttft`` (mean TTFT of the
shortest class; lower wins), ``tail_e2e`` (p99 E2E over every finished request; lower),
``goodput`` (requests/s meeting every SLO of their class; higher), ``fairness``
(Jain's index over e2e_s / output_tokens; higher; the starvation ratio is reported
beside it). Noise: a paired block bootstrap of the difference winner − runner-up
(``stats.paired_block_bootstrap``: 40 arrival-time windows resampled together for both
policies, 200 resamples, seed 20260101); the difference is "beyond noise" when its 95%
CI excludes 0. Fewer than ``stats.MIN_SHARED_BLOCKS`` windows holding requests of both
policies give no interval: "too few requests to tell". Equal values are a tie, with no
winner. A verdict on a generator-limited cell says its latencies include the load
generator's delay.

Requests cut in flight by the end of a run (censored: harness/records/request_stats.py)
are work a policy's value does not cover. When the two sides' counts of cut requests
differ by more than their noise (Poisson: by more than :data:`CUT_NOISE_SIGMAS` x
sqrt(a + b)), the policies were not measured on the same work: the verdict names no
winner and says so. Counts within that noise leave the verdict, which names them.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from harness.records.request_stats import CUT_AT, cut_rows
from harness.report.stats import (
    MIN_SHARED_BLOCKS,
    clean,
    jain_index,
    paired_block_bootstrap,
    percentile,
    time_blocks,
)

#: Two values this close (relative to the larger) are equal: a tie, which names no
#: winner. Not a noise test (that is the bootstrap's): only equal numbers, up to float
#: rounding.
TIE_RELATIVE = 1e-9

#: Cut counts a and b differ beyond noise when |a - b| > this x sqrt(a + b) (each count
#: taken as Poisson, so the variance of their difference is about a + b).
CUT_NOISE_SIGMAS = 2.0

#: What a goodput verdict says when no SLO applied (``slo_met`` is ``status == ok``).
NO_SLOS = "(no SLOs known: goodput here is finished requests per second)"

OBJECTIVES = {
    # name: (title, lower_is_better, unit)
    "short_ttft": ("best short-class TTFT (mean)", True, "s"),
    "tail_e2e": ("best tail E2E (p99)", True, "s"),
    "goodput": ("best goodput", False, "req/s"),
    "fairness": ("fairest (Jain's index over e2e/output token)", False, ""),
}


def arrival_offsets(frame: pl.DataFrame) -> np.ndarray:
    """Each request's arrival as an offset into its own run's schedule, in seconds.

    Block bootstraps pair the policies' requests by arrival window, so the windows must
    be on one axis for every policy: served cells run one after another, and their
    ``scheduled_at`` (wall-clock instants) do not overlap at all. The load generator's
    ``schedule_offset_s`` is that axis; records without it come from a simulation, whose
    virtual clock starts every policy at 0, so their ``scheduled_at`` is already one.
    A served row without a planned offset (a closed loop's, a session's later turn)
    gets its instant on that axis.
    """
    if "schedule_offset_s" in frame.columns:
        offsets = frame["schedule_offset_s"].cast(pl.Float64)
        if offsets.null_count() == 0:
            return offsets.to_numpy()
        # Closed-loop rows and a session's later turns have no planned offset: theirs is
        # their instant on the run's axis (the run starts at scheduled_at - offset of any
        # row that has both).
        at = frame["scheduled_at"].cast(pl.Float64)
        starts = (at - offsets).drop_nulls()
        if starts.len():
            return offsets.fill_null(at - starts.median()).to_numpy()
    return frame["scheduled_at"].cast(pl.Float64).to_numpy()


def _span(policies: dict[str, dict]) -> tuple[float, float]:
    """First and last arrival offset over every policy (the block windows' range)."""
    offsets = np.concatenate(
        [arrival_offsets(p["frame"].drop_nulls("scheduled_at")) for p in policies.values()]
    )
    return (float(offsets.min()), float(offsets.max())) if offsets.size else (0.0, 1.0)


def equal(a: float, b: float) -> bool:
    """Whether ``a`` and ``b`` are the same value (within :data:`TIE_RELATIVE`)."""
    return a == b or abs(a - b) <= TIE_RELATIVE * max(abs(a), abs(b))


def _names(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def _counts(frame: pl.DataFrame, cls: str | None) -> dict[str, int]:
    """``{ok, total}``: the requests of class ``cls`` (None: every class) and how many of
    them finished ok — what a verdict about that class stands on."""
    rows = frame if cls is None else frame.filter(pl.col("class") == cls)
    out = {"ok": int((rows["status"] == "ok").sum()), "total": rows.height}
    if CUT_AT in rows.columns:  # a load generator's rows say which were cut in flight
        out["cut"] = cut_rows(rows).height
    return out


def cut_differs(a: int, b: int) -> bool:
    """Whether cut counts ``a`` and ``b`` differ by more than their noise."""
    return a != b and abs(a - b) > CUT_NOISE_SIGMAS * math.sqrt(a + b)


def _no_value(objective: str, values: np.ndarray, counts: dict, cls: str | None) -> str:
    """Why a policy has no value for ``objective``."""
    if objective == "goodput":
        return "no request" if not values.size else "no known duration"
    of = f" of '{cls}'" if cls is not None else ""
    if not counts["ok"]:
        return f"no finished request{of}"
    what = {"short_ttft": "a TTFT", "tail_e2e": "an E2E", "fairness": "output tokens"}
    return f"no finished request{of} with {what[objective]}"


def _series(frame: pl.DataFrame, objective: str, short_class: str | None, duration: float):
    """(values, arrival times, statistic) the objective is computed from."""
    ok = frame.filter(pl.col("status") == "ok")
    if objective == "short_ttft":
        rows = ok.filter(pl.col("class") == short_class).drop_nulls("ttft_s")
        return (
            rows["ttft_s"].to_numpy(),
            arrival_offsets(rows),
            lambda v: float(v.mean()) if v.size else None,
        )
    if objective == "tail_e2e":
        rows = ok.drop_nulls("e2e_s")
        return (
            rows["e2e_s"].to_numpy(),
            arrival_offsets(rows),
            lambda v: percentile(v, 99),
        )
    if objective == "goodput":
        # An unknown duration (0) has no rate: no verdict stands on it.
        return (
            frame["slo_met"].cast(pl.Float64).to_numpy(),
            arrival_offsets(frame),
            lambda v: float(v.sum()) / duration if duration > 0 else None,
        )
    rows = ok.filter(pl.col("output_tokens") > 0).drop_nulls("e2e_s")
    values = (rows["e2e_s"] / rows["output_tokens"].cast(pl.Float64)).to_numpy()
    return values, arrival_offsets(rows), jain_index


def verdicts(
    policies: dict[str, dict],
    short_class: str | None,
    resamples: int = 200,
    seed: int = 20260101,
    slos_known: bool = True,
) -> dict:
    """``policies``: name -> {"frame": requests, "duration_s": float, "starvation": {...}}.
    ``slos_known``: whether any SLO applied to the rows' ``slo_met``; without one, goodput
    is the rate of finished requests, and its verdict says so."""
    out: dict = {}
    if len(policies) < 2:
        return out
    start, end = _span(policies)
    for objective, (title, lower, unit) in OBJECTIVES.items():
        if objective == "short_ttft" and short_class is None:
            continue
        cls = short_class if objective == "short_ttft" else None
        scored = []
        prepared = {}
        no_value = {}
        counts = {n: _counts(p["frame"], cls) for n, p in policies.items()}
        for name, p in policies.items():
            values, at, stat = _series(p["frame"], objective, short_class, p["duration_s"])
            value = stat(values) if values.size else None
            prepared[name] = (values, time_blocks(at, start, end), stat)
            if value is not None:
                scored.append((value, name))
            else:
                no_value[name] = _no_value(objective, values, counts[name], cls)
        if len(scored) < 2:
            continue
        scored.sort(reverse=not lower)
        (best_v, best), (next_v, runner) = scored[0], scored[1]
        va, ba, stat = prepared[best]
        vb, bb, _ = prepared[runner]
        ci = paired_block_bootstrap(
            (va, ba),
            (vb, bb),
            stat,
            resamples=resamples,
            seed=seed,
            min_shared_blocks=MIN_SHARED_BLOCKS,
        )
        margin = best_v - next_v
        # Equal values: a tie, no winner (and nothing beyond noise to claim).
        level = {n for v, n in scored if equal(v, best_v)}
        tied = [n for n in policies if n in level]  # in the run's order
        tie = len(tied) >= 2
        beyond = not tie and ci is not None and (ci[0] > 0 or ci[1] < 0)
        entry = {
            "title": title,
            "winner": None if tie else best,
            "runner_up": None if tie else runner,
            "tie": tie,
            "tied": tied if tie else [],
            "unit": unit,
            "value": clean(best_v),
            "runner_up_value": clean(next_v),
            "margin": clean(margin),
            "relative_margin": clean(margin / next_v) if next_v else None,
            "ci95_of_difference": [clean(ci[0]), clean(ci[1])] if ci else None,
            "beyond_noise": beyond,
            "values": {n: clean(v) for v, n in scored},
            # the requests each side's value stands on (the class the verdict is about)
            "requests": {n: counts[n] for n in (tied if tie else [best, runner])},
            # the policies left out of the verdict, and why
            "no_value": no_value,
        }
        # the cells whose values the verdict stands on that a limited generator delayed
        entry["generator_limited"] = _limited(policies, [n for _, n in scored])
        cuts = {n: c["cut"] for n, c in entry["requests"].items() if c.get("cut") is not None}
        if len(cuts) == 2 and cut_differs(*cuts.values()):
            # not the same work: no winner (the sentence says why)
            entry.update(winner=None, runner_up=None, beyond_noise=False, cut_differs=True)
        if objective == "goodput":
            entry["slos_known"] = slos_known
        if objective == "fairness":
            entry["starvation_ratio"] = {
                n: (p.get("starvation") or {}).get("ratio_p99_queue") for n, p in policies.items()
            }
        entry["sentence"] = _sentence(objective, entry, short_class)
        out[objective] = entry
    return out


def _limited(policies: dict[str, dict], names: list[str]) -> list[str]:
    """Those of ``names`` whose load generator could not keep to the schedule."""
    return [n for n in names if policies[n].get("generator_limited")]


def _caveats(e: dict, over_ok_rows: bool = True) -> str:
    """What the verdict stands on that its numbers do not show, as `` (...)`` each.
    ``over_ok_rows``: the value is a statistic of the finished requests, so different ok
    counts mean different requests (goodput's is over every request: a failed one counts
    as missing its SLOs)."""
    out = ""
    sides = e.get("requests") or {}
    if over_ok_rows and len({c["ok"] for c in sides.values()}) > 1:
        out += (
            " (over different requests: "
            + ", ".join(
                f"{n} {c['ok']} of {c['total']}" + (" ok" if i == 0 else "")
                for i, (n, c) in enumerate(sides.items())
            )
            + ")"
        )
    cut = {n: c["cut"] for n, c in sides.items() if c.get("cut")}
    if cut:
        out += (
            " ("
            + ", ".join(f"{n} {k} of {sides[n]['total']}" for n, k in cut.items())
            + " cut in flight: censored)"
        )
    for name, why in (e.get("no_value") or {}).items():
        out += f" ({name}: {why})"
    if e.get("generator_limited"):
        out += (
            f" ({_names(e['generator_limited'])}: generator-limited, latencies include the "
            "load generator's delay)"
        )
    return out


def _fmt(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"
    return f"{value:.3f}{(' ' + unit) if unit else ''}"


def _sentence(objective: str, e: dict, short_class: str | None) -> str:
    what = {
        "short_ttft": f"mean TTFT of '{short_class}'",
        "tail_e2e": "p99 E2E",
        "goodput": "goodput" + ("" if e.get("slos_known", True) else f" {NO_SLOS}"),
        "fairness": "Jain's index",
    }[objective]
    caveats = _caveats(e, over_ok_rows=objective != "goodput")
    if e.get("cut_differs"):
        sides = e["requests"]
        of = f" '{short_class}'" if objective == "short_ttft" else ""
        cut = ", ".join(f"{n} {c['cut']} of {c['total']}{of}" for n, c in sides.items())
        return (
            f"no verdict on {what}: the runs stopped with different numbers of requests cut "
            f"in flight ({cut}), beyond their noise, so the policies' values cover different "
            "work; wait longer for them (--grace) or load less (--rate-scale auto)"
            f"{_caveats({**e, 'requests': {}})}."
        )
    if e.get("tie"):
        return f"{_names(e['tied'])} tie on {what}: {_fmt(e['value'], e['unit'])} each{caveats}."
    rel = f" ({abs(e['relative_margin']):.0%})" if e.get("relative_margin") is not None else ""
    noise = (
        "beyond run-to-run noise (95% CI of the difference "
        f"{_fmt(e['ci95_of_difference'][0], e['unit'])} .. "
        f"{_fmt(e['ci95_of_difference'][1], e['unit'])})"
        if e["beyond_noise"]
        else "within run-to-run noise"
        + (
            f" (95% CI of the difference {_fmt(e['ci95_of_difference'][0], e['unit'])} .. "
            f"{_fmt(e['ci95_of_difference'][1], e['unit'])} includes 0)"
            if e.get("ci95_of_difference")
            else " (too few requests to tell)"
        )
    )
    return (
        f"{e['winner']} has the best {what}: {_fmt(e['value'], e['unit'])} against "
        f"{e['runner_up']}'s {_fmt(e['runner_up_value'], e['unit'])}, a margin of "
        f"{_fmt(abs(e['margin']), e['unit'])}{rel}, {noise}{caveats}."
    )


def against_fcfs(
    policies: dict[str, dict],
    short_class: str | None,
    long_class: str | None,
    resamples: int = 200,
    seed: int = 20260101,
    baseline: str = "fcfs",
) -> list[dict]:
    """Each policy against FCFS (the ``baseline`` cell: ``fcfs``, or a matrix group's
    ``fcfs-x2``) on short-class mean TTFT and long-class p99 queue wait, in words (the
    headline checks)."""
    if baseline not in policies:
        return []
    base = policies[baseline]
    out = []
    start, end = _span(policies)
    for name, p in policies.items():
        if name == baseline:
            continue
        for cls, metric, label, stat in (
            (short_class, "ttft_s", "mean TTFT", lambda v: float(v.mean()) if v.size else None),
            (
                long_class,
                "queue_s",
                "p99 queue wait",
                lambda v: percentile(v, 99),
            ),
        ):
            if cls is None:
                continue
            a = (
                p["frame"]
                .filter((pl.col("class") == cls) & (pl.col("status") == "ok"))
                .drop_nulls(metric)
            )
            b = (
                base["frame"]
                .filter((pl.col("class") == cls) & (pl.col("status") == "ok"))
                .drop_nulls(metric)
            )
            sides = {
                name: _counts(p["frame"], cls),
                baseline: _counts(base["frame"], cls),
            }
            if a.height == 0 or b.height == 0:
                if a.height or b.height:  # one side only: named, not left out
                    line = _one_sided(name, baseline, cls, metric, label, a.height == 0, sides)
                    line["value" if a.height else "fcfs_value"] = clean(
                        stat((a if a.height else b)[metric].to_numpy())
                    )
                    line["generator_limited"] = _limited(policies, [name, baseline])
                    out.append(line)
                continue
            va, vb = a[metric].to_numpy(), b[metric].to_numpy()
            sa, sb = stat(va), stat(vb)
            # rows on both sides, no NaN (report.validate refuses it): both are defined
            assert sa is not None and sb is not None
            ci = paired_block_bootstrap(
                (va, time_blocks(arrival_offsets(a), start, end)),
                (vb, time_blocks(arrival_offsets(b), start, end)),
                stat,
                resamples=resamples,
                seed=seed,
                min_shared_blocks=MIN_SHARED_BLOCKS,
            )
            tie = equal(sa, sb)
            beyond = not tie and ci is not None and (ci[0] > 0 or ci[1] < 0)
            verb = "leaves" if tie else "lowers" if sa < sb else "raises"
            rel = f" ({abs(sa - sb) / sb:.0%})" if sb else ""
            noise = (
                ""
                if tie
                else ", beyond run-to-run noise"
                if beyond
                else ", within run-to-run noise" + ("" if ci else " (too few requests to tell)")
            )
            entry = {
                "requests": sides,
                "generator_limited": _limited(policies, [name, baseline]),
            }
            out.append(
                {
                    "policy": name,
                    "class": cls,
                    "metric": f"{label} ({metric})",
                    "value": clean(sa),
                    "fcfs_value": clean(sb),
                    "difference": clean(sa - sb),
                    "ci95_of_difference": [clean(ci[0]), clean(ci[1])] if ci else None,
                    "beyond_noise": beyond,
                    "lower_than_fcfs": not tie and sa < sb,
                    "tie": tie,
                    "baseline": baseline,
                    **entry,
                    "sentence": (
                        f"{name.upper()} {verb} {label} of '{cls}' "
                        + ("unchanged " if tie else "")
                        + f"against {baseline.upper()}: "
                        f"{_fmt(sa, 's')} vs {_fmt(sb, 's')}{'' if tie else rel}{noise}"
                        f"{_caveats(entry)}."
                    ),
                }
            )
    return out


def _one_sided(
    name: str,
    baseline: str,
    cls: str,
    metric: str,
    label: str,
    policy_lacks: bool,
    sides: dict[str, dict],
) -> dict:
    """The line against FCFS when one side has no value: no comparison, and who lacks it."""
    lacking = name if policy_lacks else baseline
    why = (
        f"no finished request of '{cls}'"
        if sides[lacking]["ok"] == 0
        else f"no finished request of '{cls}' with its {metric}"
    )
    return {
        "policy": name,
        "class": cls,
        "metric": f"{label} ({metric})",
        "value": None,
        "fcfs_value": None,
        "difference": None,
        "ci95_of_difference": None,
        "beyond_noise": False,
        "lower_than_fcfs": None,
        "tie": False,
        "baseline": baseline,
        "requests": sides,
        "no_value": {lacking: why},
        "sentence": (
            f"{name.upper()} against {baseline.upper()} on {label} of '{cls}': no "
            f"comparison ({lacking}: {why})."
        ),
    }
