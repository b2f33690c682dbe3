"""The simulator against a served run: each served cell's schedule simulated with the
cost model this machine had before the run (``schedscope run`` writes it to
``<cell>/simulated/``, docs/run.md), compared per policy and class, and whether the
simulated policy ranking is the served one (docs/report.md, "Simulator vs this run").

Figures: TTFT and E2E p50/p95 over the ``ok`` requests of each side (exact
percentiles, :mod:`harness.report.stats`), and the relative error
(simulated - served) / served.

Ranking, per class and metric (TTFT p95, E2E p95), within a group of cells that share
their load (:mod:`harness.report.cells`). A pair whose two values lie within
:data:`TIE_TOLERANCE` of each other (relative to the larger) is a tie on that side: a
difference that small is within a run's noise, and says nothing about the order. A pair
is *compared* when both sides order it. The ranking matches when at least one pair is
compared and no compared pair is ordered one way served and the other way simulated; it
differs when one is; it is undetermined when no pair is compared (one side ties every
pair — a simulator whose every figure is 4x off, all within 10% of each other, is not
evidence that it ranks the policies right — or fewer than two policies have values), and
when a policy has a value on one side only (no ok request of the class on the other:
where that side would put it is unknown, and the others alone are not the ranking). A
policy without a value is never dropped silently: it is listed in ``missing``.

Speed band: when the check's model has seen this machine's steps run at different speeds
(:mod:`harness.simulate.speed_band`), the counterpart's summary.json carries the same schedule
simulated at the slowest and fastest of them; each figure then also says whether the
served value lies inside that band (``band``, ``in_band``).
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import NotRequired, TypedDict

import polars as pl

from harness.report.cells import CellIdentity, cell_groups
from harness.report.stats import percentile
from harness.simulate.speed_band import METRICS, STATS, policy_part
from harness.simulate.speed_band import SUMMARY_KEY as SPEED_BAND_KEY

#: A served cell's simulated counterpart: ``<cell>/simulated/requests.parquet``.
SIMULATED_DIR = "simulated"
#: The key of a served cell's run.json that names the model the check used.
RUN_JSON_KEY = "simulator_check"
#: The key of a served cell's run.json that says how the check's refit went (what it
#: stored, which sources and steps it left out).
COST_FIT_KEY = "cost_fit"
#: Two values within 10% of the larger are a tie (the module docstring's rule).
TIE_TOLERANCE = 0.10
#: What the ranking is by.
RANKED_BY = ("ttft_s_p95", "e2e_s_p95")


def simulated_requests(cell_dir: Path) -> Path:
    return cell_dir / SIMULATED_DIR / "requests.parquet"


def relative_error(served: float | None, simulated: float | None) -> float | None:
    """(simulated - served) / served; None when either is unknown or served is 0."""
    if served is None or simulated is None or served == 0:
        return None
    return (simulated - served) / served


def _figures(frame: pl.DataFrame) -> dict[str, float | None]:
    ok = frame.filter(pl.col("status") == "ok")
    return {
        f"{m}_{s}": percentile(ok[m].to_numpy(), float(s[1:])) if m in ok.columns else None
        for m in METRICS
        for s in STATS
    }


def class_rows(
    served: pl.DataFrame, simulated: pl.DataFrame, band: dict | None = None
) -> dict[str, dict]:
    """Class (and ``all``) -> ``{requests, simulated_requests, <metric>_<stat>: {served,
    simulated, rel_error}}``, over the classes either side has. With ``band`` (the
    counterpart's speed band for this cell: class -> metric -> stat -> ``{fastest,
    slowest}``), each figure the band has also gets it as ``band`` and ``in_band``:
    whether the served value lies between its ends (None when either is unknown)."""
    classes = sorted(set(served["class"].drop_nulls()) | set(simulated["class"].drop_nulls()))
    out: dict[str, dict] = {}
    for cls in ["all", *classes]:
        a = served if cls == "all" else served.filter(pl.col("class") == cls)
        b = simulated if cls == "all" else simulated.filter(pl.col("class") == cls)
        fa, fb = _figures(a), _figures(b)
        row: dict = {
            "requests": int((a["status"] == "ok").sum()),
            "simulated_requests": int((b["status"] == "ok").sum()),
        }
        for key in fa:
            row[key] = {
                "served": fa[key],
                "simulated": fb[key],
                "rel_error": relative_error(fa[key], fb[key]),
            }
            metric, stat = key.rsplit("_", 1)
            ends = ((band or {}).get(cls) or {}).get(metric, {}).get(stat)
            if ends:
                row[key].update(band=ends, in_band=_inside(fa[key], ends))
        out[cls] = row
    return out


def _inside(value: float | None, ends: dict) -> bool | None:
    low, high = ends.get("fastest"), ends.get("slowest")
    if value is None or low is None or high is None:
        return None
    return min(low, high) <= value <= max(low, high)


def _order(a: float | None, b: float | None) -> int | None:
    """-1 (a lower), 1 (b lower), 0 (a tie by :data:`TIE_TOLERANCE`), None (unknown)."""
    if a is None or b is None:
        return None
    if abs(a - b) <= TIE_TOLERANCE * max(abs(a), abs(b)):
        return 0
    return -1 if a < b else 1


def ranking(values: dict[str, tuple[float | None, float | None]]) -> dict:
    """Policy -> (served, simulated) of one metric: both orders (lowest first), whether
    they match (True, False, or None: undetermined; the module docstring's rule), the
    pairs that disagree, how many pairs were compared, the policies left out for want of
    a value (``missing``) and, when undetermined, why."""
    known: dict[str, tuple[float, float]] = {
        p: (v[0], v[1]) for p, v in values.items() if v[0] is not None and v[1] is not None
    }
    missing = sorted(p for p in values if p not in known)
    # A value on one side only: what that side did with the policy is unknown, so no
    # order of the policies can be said to match (dropping it would check the others only).
    one_sided = [
        f"{p} has no {'served' if values[p][0] is None else 'simulated'} value (no ok request)"
        for p in missing
        if (values[p][0] is None) != (values[p][1] is None)
    ]
    reversed_pairs = []
    compared = served_ordered = simulated_ordered = 0
    for a, b in combinations(sorted(known), 2):
        served = _order(known[a][0], known[b][0])
        simulated = _order(known[a][1], known[b][1])
        served_ordered += bool(served)
        simulated_ordered += bool(simulated)
        if served and simulated:
            compared += 1
            if served != simulated:
                reversed_pairs.append([a, b])
    served_order = sorted(known, key=lambda p: (known[p][0], p))
    simulated_order = sorted(known, key=lambda p: (known[p][1], p))
    return {
        "served_order": served_order,
        "simulated_order": simulated_order,
        "served": order_text(served_order, {p: v[0] for p, v in known.items()}),
        "simulated": order_text(simulated_order, {p: v[1] for p, v in known.items()}),
        "matches": None if not compared or one_sided else not reversed_pairs,
        "reversed_pairs": reversed_pairs,
        "pairs_compared": compared,
        "missing": missing,
        "undetermined": "; ".join(one_sided)
        or _undetermined(len(known), served_ordered, simulated_ordered, compared),
    }


def _undetermined(policies: int, served: int, simulated: int, compared: int) -> str | None:
    """Why no pair could be compared (None when one was)."""
    if compared:
        return None
    if policies < 2:
        return "fewer than two policies have this figure on both sides"
    within = f"within {TIE_TOLERANCE:.0%}"
    if not served and not simulated:
        return f"both sides tie every pair ({within})"
    if not simulated:
        return f"the simulated side ties every pair ({within})"
    if not served:
        return f"the served side ties every pair ({within})"
    return f"no pair is ordered on both sides (the others tie, {within}, on one side)"


def order_text(order: list[str], values: dict[str, float]) -> str:
    """``a < b ≈ c``: each policy against the one before it, ``≈`` for a tie."""
    text = order[0] if order else ""
    for before, policy in zip(order, order[1:], strict=False):
        text += f" {'≈' if _order(values[before], values[policy]) == 0 else '<'} {policy}"
    return text


class CheckedCell(TypedDict):
    """One cell of :func:`compare`'s ``cells``."""

    model: dict | None  # its run.json entry
    classes: dict[str, dict]  # class_rows
    speed_band: NotRequired[dict[str, dict]]  # the band's time_ratios and sources
    cost_fit: NotRequired[dict]  # its run.json refit entry, when it has one
    read_at_once: dict | None  # read_at_once_count of its served requests


def read_at_once_count(frame: pl.DataFrame) -> dict | None:
    """{"requests": how many of the cell's ok requests reached the client in one go
    (harness/records/stream_reads.py), "of": how many ok requests had a stream}; None
    without token gaps (a simulated cell's frame, records without ``itl_s``)."""
    from harness.records.stream_reads import read_at_once

    if "itl_s" not in frame.columns or "request_id" not in frame.columns:
        return None
    ok = frame.filter(pl.col("status") == "ok")
    late = read_at_once(ok["request_id"].to_list(), ok["itl_s"].to_list())
    return {"requests": len(late), "of": ok.height}


def compare(
    served: dict[str, pl.DataFrame],
    simulated: dict[str, pl.DataFrame],
    models: dict[str, dict],
    bands: dict[str, dict] | None = None,
    identities: dict[str, CellIdentity] | None = None,
    fits: dict[str, dict] | None = None,
) -> dict:
    """The section's content from each cell's served and simulated request frames
    (columns ``class``, ``status``, ``ttft_s``, ``e2e_s``), the model each check used
    (its run.json entry) and, where the counterpart has one, its speed band (summary.json
    ``speed_band``): ``cells`` (cell -> model, class rows, the band's ``speed_band``
    ratios and sources, and ``cost_fit``: the cell's refit entry of ``fits``, the
    run.json ``cost_fit``) and ``rankings`` (group -> class -> metric ->
    :func:`ranking`). ``identities``: each cell's policy and group (default: one group)."""
    bands = bands or {}
    identities = identities or {}
    fits = fits or {}
    cells: dict[str, CheckedCell] = {}
    for name in served:
        if name not in simulated:
            continue
        part = policy_part(bands.get(name))
        cells[name] = {
            "model": models.get(name),
            "classes": class_rows(served[name], simulated[name], part and part["groups"]),
            "read_at_once": read_at_once_count(served[name]),
        }
        if part:
            cells[name]["speed_band"] = {
                "time_ratios": part["time_ratios"],
                "sources": part["sources"],
            }
        if name in fits:
            cells[name]["cost_fit"] = fits[name]
    rankings: dict[str, dict] = {}
    ids = {n: identities.get(n, CellIdentity(None, "")) for n in cells}
    for group, names in cell_groups(ids).items():
        classes = sorted({c for n in names for c in cells[n]["classes"]})
        rankings[group] = {
            cls: {
                key: ranking(
                    {
                        n: (
                            cells[n]["classes"][cls][key]["served"],
                            cells[n]["classes"][cls][key]["simulated"],
                        )
                        for n in names
                        if cls in cells[n]["classes"]
                    }
                )
                for key in RANKED_BY
            }
            for cls in classes
        }
    return {"tie_tolerance": TIE_TOLERANCE, "cells": cells, "rankings": rankings}


def read_speed_band(cell_dir: Path) -> dict | None:
    """The speed band of ``cell_dir``'s simulated counterpart; None when it has none."""
    try:
        summary = json.loads((cell_dir / SIMULATED_DIR / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    band = summary.get(SPEED_BAND_KEY) if isinstance(summary, dict) else None
    return band if isinstance(band, dict) else None


def read_model_entry(cell_dir: Path, key: str = RUN_JSON_KEY) -> dict | None:
    """The model the check of ``cell_dir`` used, from its run.json (or the entry of
    another ``key``: :data:`COST_FIT_KEY`, the refit after it); None when unknown."""
    try:
        info = json.loads((cell_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    entry = info.get(key) if isinstance(info, dict) else None
    return entry if isinstance(entry, dict) else None


def for_cells(
    served: dict[str, tuple[Path, pl.DataFrame]],
    identities: dict[str, CellIdentity] | None = None,
) -> dict | None:
    """:func:`compare` over the cells (name -> (directory, served frame)) that have a
    simulated counterpart; None when none has (a run made before the check, a
    --simulate or --target run)."""
    simulated, frames, models, bands, fits = {}, {}, {}, {}, {}
    for name, (cell_dir, frame) in served.items():
        path = simulated_requests(cell_dir)
        if not path.is_file():
            continue
        try:
            simulated[name] = pl.read_parquet(
                path, columns=["class", "status", *METRICS], glob=False
            )
        except (OSError, pl.exceptions.PolarsError):
            continue
        frames[name] = frame
        models[name] = read_model_entry(cell_dir) or {}
        band = read_speed_band(cell_dir)
        if band is not None:
            bands[name] = band
        fit = read_model_entry(cell_dir, COST_FIT_KEY)
        if fit is not None:
            fits[name] = fit
    if not simulated:
        return None
    return compare(frames, simulated, models, bands, identities, fits)
