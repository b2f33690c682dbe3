"""Writing the report: report.html (self-contained), report.md, summary.json and the
derived Parquet files (``stalls.parquet``, ``classes.parquet``)."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from harness.costmodel.evidence import left_out_text
from harness.loadgen.prompt_choice import PromptChoice
from harness.profiles.rate_scale import ChosenScale
from harness.report import errors
from harness.report.build import Report
from harness.report.stall_causes import CAUSE_LABELS, EXTERNAL_UNKNOWN, STALL_CAUSES
from harness.report.stalls import is_external
from harness.report.summary import flat_rows, summary_json
from harness.simulate.speed_band import METRICS as BAND_METRICS
from harness.simulate.speed_band import STATS as BAND_STATS

CLASS_HEADERS = [
    "run",
    "policy",
    "class",
    "requests",
    "ok",
    "rej",
    "err",
    "req/s",
    "tok/s",
    "goodput/s",
    "SLO met",
    "TTFT p50",
    "TTFT p95",
    "TTFT p99",
    "TPOT p50",
    "TPOT p95",
    "TPOT p99",
    "ITL p50",
    "ITL p95",
    "ITL p99",
    "E2E p50",
    "E2E p95",
    "E2E p99",
    "queue p99",
    "queue max",
    "preempt swap",
    "preempt recompute",
    "stalls",
    "stall s",
    "gen lag p99",
    "Jain",
]


def _ms(value) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"


def _stat(distribution: dict, statistic: str) -> str:
    """A latency statistic, ``≥`` before one that requests cut in flight bound from below
    (harness/records/request_stats.py, censoring)."""
    text = _ms(distribution.get(statistic))
    bounded = distribution.get("lower_bound") or ()
    return f"≥ {text}" if statistic in bounded and text != "–" else text


def _num(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _count(value) -> str:
    """A count, or "–" where it cannot be known (an external engine's preemptions)."""
    return "–" if value is None else str(value)


def class_rows(report: Report) -> list[list[str]]:
    rows = []
    for rr in report.runs:
        for name, p in rr.policies.items():
            groups = [("all", p.groups["overall"]), *p.groups["classes"].items()]
            for cls, g in groups:
                m = g["metrics"]
                lag = g.get("generator_lag_s")
                rows.append(
                    [
                        rr.run.label,
                        name,
                        cls,
                        str(g["requests"]),
                        str(g["counts"]["ok"]),
                        str(g["counts"]["rejected"]),
                        str(g["counts"]["error"] + g["counts"]["aborted"]),
                        _num(g["throughput_rps"]),
                        _num(g["output_tokens_per_s"], 0),
                        _num(g["goodput_rps"]),
                        "–" if g["slo_attainment"] is None else f"{g['slo_attainment']:.0%}",
                        *[_stat(m["ttft_s"], k) for k in ("p50", "p95", "p99")],
                        *[_ms(m["tpot_s"].get(k)) for k in ("p50", "p95", "p99")],
                        *[_ms(g["itl_s"].get(k)) for k in ("p50", "p95", "p99")],
                        *[_stat(m["e2e_s"], k) for k in ("p50", "p95", "p99")],
                        _ms(m["queue_s"].get("p99")),
                        _ms(m["queue_s"].get("max")),
                        _count(g["preemptions"]["swap"]),
                        _count(g["preemptions"]["recompute"]),
                        str(g["stalls"]),
                        _num(g["stall_time_s"]),
                        "none" if lag is None else _ms(lag["p99"]),
                        _num(g["jain_index"], 3),
                    ]
                )
    return rows


STALL_HEADERS = [
    "run",
    "policy",
    *[f"{CAUSE_LABELS[c]} (n / s)" for c in STALL_CAUSES],
    "total s",
    "threshold",
]


def _cause_cell(by: dict, cause: str, external: bool) -> str:
    """``n / s`` of a cause, or "–" where it cannot be known or cannot apply: an
    external engine's own causes, and the external cause of a cell whose engine is seen."""
    if external != (cause == EXTERNAL_UNKNOWN):
        return "–"
    return f"{by[cause]['count']} / {by[cause]['time_s']:.2f}"


def stall_rows(report: Report) -> list[list[str]]:
    rows = []
    for rr in report.runs:
        for name, p in rr.policies.items():
            by = p.groups["overall"]["stalls_by_cause"]
            external = is_external(p.data)
            rows.append(
                [
                    rr.run.label,
                    name,
                    *[_cause_cell(by, c, external) for c in STALL_CAUSES],
                    _num(p.groups["overall"]["stall_time_s"]),
                    _ms(p.threshold_s),
                ]
            )
    return rows


SIMULATOR_HEADERS = [
    "run",
    "policy",
    "class",
    "ok served / sim",
    *[
        f"{metric} {stat} {side}"
        for metric in ("TTFT", "E2E")
        for stat in ("p50", "p95")
        for side in ("served", "sim", "err")
    ],
]


def _rel(value) -> str:
    return "–" if value is None else f"{value:+.0%}"


def simulator_rows(report: Report) -> list[list[str]]:
    """The "simulator vs this run" table: per cell x class, served beside simulated."""
    rows = []
    for rr in report.runs:
        for name, cell in ((rr.simulator_check or {}).get("cells") or {}).items():
            for cls, row in cell["classes"].items():
                figures = []
                for key in ("ttft_s_p50", "ttft_s_p95", "e2e_s_p50", "e2e_s_p95"):
                    v = row[key]
                    figures += [_ms(v["served"]), _ms(v["simulated"]), _rel(v["rel_error"])]
                rows.append(
                    [
                        rr.run.label,
                        name,
                        cls,
                        f"{row['requests']} / {row['simulated_requests']}",
                        *figures,
                    ]
                )
    return rows


def simulator_lines(report: Report) -> list[str]:
    """Which model each check used, then the ranking per group, class and metric."""
    lines = []
    for rr in report.runs:
        check = rr.simulator_check
        if not check:
            continue
        for name, cell in check["cells"].items():
            model = cell.get("model") or {}
            predates = model.get("predates_run")
            lines.append(
                f"{rr.run.label}/{name}: simulated with "
                + {"builtin": "the built-in cost model", None: "an unrecorded cost model"}.get(
                    model.get("model"), str(model.get("model"))
                )
                + (f", the fit of target:{model['target']}" if model.get("target") else "")
                + (f" (fitted {model['fitted_at']})" if model.get("fitted_at") else "")
                + (f" [key {model['fingerprint_key']}]" if model.get("fingerprint_key") else "")
                + {
                    True: "; fitted before the run: out of sample",
                    False: "; NOT fitted before the run: not out of sample",
                    None: "",
                }[predates]
            )
            text = priced_steps_text(model)
            if text:
                lines.append(f"{rr.run.label}/{name}: {text}")
            band = cell.get("speed_band")
            text = speed_band_text(band, cell["classes"]) if band else None
            if text:
                lines.append(f"{rr.run.label}/{name}: {text}")
            text = cost_fit_text(cell.get("cost_fit") or {})
            if text:
                lines.append(f"{rr.run.label}/{name}: {text}")
            late = cell.get("read_at_once") or {}
            if late.get("requests"):
                lines.append(
                    f"{rr.run.label}/{name}: {late['requests']} of {late['of']} served "
                    "requests reached the client in one go (nine in ten of their tokens "
                    "read together): their TTFT is their E2E, a delivery delay of the load "
                    "generator or the server's API process that the simulator does not "
                    "model; the served TTFT percentiles carry it"
                )
        for group, classes in check["rankings"].items():
            prefix = f"{rr.run.label}" + (f" [{group.lstrip('-')}]" if group else "")
            for cls, by in classes.items():
                for key, r in by.items():
                    if r["matches"] is None:
                        if len(r["served_order"]) + len(r.get("missing", [])) < 2:
                            continue  # one policy: there is no ranking to check
                        verdict = f"ranking undetermined: {r['undetermined']}"
                    elif r["matches"]:
                        verdict = "ranking matches"
                    else:
                        verdict = (
                            "ranking differs (reversed: "
                            + ", ".join(f"{a} vs {b}" for a, b in r["reversed_pairs"])
                            + ")"
                        )
                    metric = key.replace("ttft_s_", "TTFT ").replace("e2e_s_", "E2E ")
                    said = r["undetermined"] or ""
                    absent = [p for p in r.get("missing", []) if f"{p} has no " not in said]
                    if absent:
                        verdict += f" (left out, no value on either side: {', '.join(absent)})"
                    lines.append(
                        f"{prefix} '{cls}' by {metric}: served {r['served']}, "
                        f"simulated {r['simulated']}: {verdict}"
                    )
    return lines


#: A check's model whose prices are off this run's served steps by more than this share
#: is named stale, with the command that fits it again: near saturation a step-cost
#: error comes out several times larger in the latencies (23% came out 21-92% on
#: chat_sessions at 1x, docs/simulator.md).
STALE_PRICE_BAND = 0.10


def priced_steps_text(model: dict) -> str | None:
    """What a simulator check's model prices the run's own served steps at, beside what
    they took, and — where the two differ by more than :data:`STALE_PRICE_BAND` — that
    the model is not of this machine as it ran, and how to fit it again; None when the
    check priced no steps."""
    priced = model.get("steps_priced") or {}
    ratio = priced.get("ratio")
    if not ratio:
        return None
    text = (
        f"its {priced['steps']:,} served steps took {priced['served_s']:.1f} s; the model "
        f"prices the same steps at {priced['model_s']:.1f} s (served/model {ratio:.2f}: the "
        "step costs' share of the errors below; what it leaves is the simulated schedule's)"
    )
    if 1 - STALE_PRICE_BAND <= ratio <= 1 + STALE_PRICE_BAND:
        return text
    if model.get("target"):
        fix = "`schedscope calibrate --from-run` of a run like this one fits it again"
    elif model.get("model") == "builtin":
        fix = "`schedscope calibrate --quick` fits this machine"
    else:
        fix = "`schedscope calibrate --quick` fits it again"
    return (
        f"{text}. The steps ran {abs(ratio - 1):.0%} "
        f"{'slower' if ratio > 1 else 'faster'} than the model prices them: it is not "
        f"of this machine as it ran, and near saturation such an error grows several "
        f"times in the latencies; {fix}"
    )


def cost_fit_text(entry: dict) -> str | None:
    """What the cell's refit of this machine's cost model (its run.json ``cost_fit``)
    left out, in one line: the sources whose steps ran off the pool's speed, and the
    cell's step cycles that started while its load generator lagged; None when it left
    out nothing (or kept the off-speed sources, as asked: then it says that)."""
    parts = []
    left_out = entry.get("sources_left_out") or []
    if left_out:
        parts.append(
            "its refit of this machine's cost model left out the sources whose steps ran off "
            "the pool's speed (--keep-off-speed-sources keeps them): " + left_out_text(left_out)
        )
    kept = entry.get("off_speed_sources_kept") or []
    if kept:
        parts.append(
            "its refit of this machine's cost model kept, as --keep-off-speed-sources asked, "
            "the sources whose steps ran off the pool's speed: " + left_out_text(kept)
        )
    skipped = entry.get("generator_limited_steps_left_out")
    if skipped:
        parts.append(
            f"{skipped:,} of its step cycles were not fitted: they started while the load "
            "generator lagged its schedule"
        )
    return "; ".join(parts) or None


def speed_band_text(band: dict, classes: dict) -> str | None:
    """How many of a cell's figures lie inside the simulated speed band, and which do
    not; None when the band covers none of them (nothing to say, and no "0 of 0")."""
    ratios = band.get("time_ratios") or {}
    inside, outside = 0, []
    for cls, row in classes.items():
        for key in (f"{m}_{s}" for m in BAND_METRICS for s in BAND_STATS):
            v = row.get(key) or {}
            if v.get("in_band") is True:
                inside += 1
            elif v.get("in_band") is False:
                metric = key.replace("ttft_s_", "TTFT ").replace("e2e_s_", "E2E ")
                lo, hi = v["band"]["fastest"], v["band"]["slowest"]
                outside.append(f"'{cls}' {metric} {_ms(v['served'])} (band {_ms(lo)}-{_ms(hi)})")
    if not inside and not outside:
        return None
    text = (
        f"at the speeds this machine's steps ran at across the model's {band.get('sources')} "
        f"sources ({ratios.get('fastest', 0):.2f}-{ratios.get('slowest', 0):.2f}x its price), "
        f"the simulated band holds {inside} of {inside + len(outside)} served figures"
    )
    return text + ("; outside it: " + ", ".join(outside) if outside else "")


SPEED_BAND_HEADERS = ["run", "policy", "class", "TTFT p50", "TTFT p95", "E2E p50", "E2E p95"]


def _speed_bands(report: Report) -> Iterator[tuple[str, str, dict]]:
    """(run label, policy, its speed band) of every simulated policy that has one."""
    for rr in report.runs:
        for name, policy in rr.policies.items():
            if policy.data.speed_band:
                yield rr.run.label, name, policy.data.speed_band


def speed_band_rows(report: Report) -> list[list[str]]:
    """The "Speed band" table of simulated policies: per policy x class, each figure's
    range at the fastest and the slowest speed the model's sources ran at."""
    rows = []
    for label, name, band in _speed_bands(report):
        for group, metrics in band["groups"].items():
            cells = []
            for metric in BAND_METRICS:
                for stat in BAND_STATS:
                    ends = (metrics.get(metric) or {}).get(stat) or {}
                    cells.append(f"{_ms(ends.get('fastest'))} – {_ms(ends.get('slowest'))}")
            rows.append([label, name, group, *cells])
    return rows


def speed_band_lines(report: Report) -> list[str]:
    """Where each simulated policy's band came from."""
    lines = []
    for label, name, band in _speed_bands(report):
        ratios = band.get("time_ratios") or {}
        lines.append(
            f"{label}/{name}: step costs at {ratios.get('fastest', 0):.2f}x and "
            f"{ratios.get('slowest', 0):.2f}x the cost model's price, the fastest and "
            f"slowest this machine ran its steps at across the fit's "
            f"{band.get('sources')} sources"
        )
    return lines


PREFIX_HEADERS = [
    "run",
    "policy",
    "class",
    "requests",
    "prompt tokens",
    "cached tokens",
    "hit rate",
    "with a hit",
    "TTFT p50 hit",
    "TTFT p95 hit",
    "TTFT p50 miss",
    "TTFT p95 miss",
    "evicted prefix tokens",
]
#: What a group whose requests carry no cached_tokens reads, in place of a hit rate.
NOT_RECORDED = "not recorded"
PREFIX_TEXT = (
    "Hit rate: cached over prompt tokens of the admitted requests whose cached_tokens is "
    "known; TTFT of the finished requests with a cached prefix (hit) and without (miss); "
    "evicted prefix tokens: prompt tokens just after the hits that the cache had held and "
    "evicted before the admission (docs/report.md, 'Prefix cache')."
)


def _pct(value) -> str:
    return "–" if value is None else f"{value:.1%}"


def _tokens(value) -> str:
    return "–" if value is None else f"{value:,}"


def prefix_rows(report: Report) -> list[list[str]]:
    """The prefix-cache table: per cell whose requests carry cached_tokens, ``all`` then
    each class; a class without any reads "not recorded"."""
    rows = []
    for rr in report.runs:
        for name, p in rr.policies.items():
            pc = p.prefix_cache
            if not pc or pc.get("overall") is None:
                continue
            for cls, g in [("all", pc["overall"]), *pc["by_class"].items()]:
                if not g["recorded"]:
                    figures = ["–", "–", NOT_RECORDED, *["–"] * 6]
                    rows.append([rr.run.label, name, cls, "0", *figures])
                    continue
                rows.append(
                    [
                        rr.run.label,
                        name,
                        cls,
                        str(g["requests"]),
                        _tokens(g["prompt_tokens"]),
                        _tokens(g["cached_tokens"]),
                        _pct(g["hit_rate"]),
                        str(g["requests_with_hit"]),
                        _ms(g["ttft_hit_p50_s"]),
                        _ms(g["ttft_hit_p95_s"]),
                        _ms(g["ttft_miss_p50_s"]),
                        _ms(g["ttft_miss_p95_s"]),
                        _tokens(g["evicted_prefix_tokens"]),
                    ]
                )
    return rows


def counters_line(counters: dict) -> str:
    """What the target's cumulative counters say over the load."""
    rate = counters.get("hit_rate")
    span = (counters.get("last_scrape") or 0.0) - (counters.get("first_scrape") or 0.0)
    line = (
        f"the target's counters over the load: {counters['used']} rose "
        f"{counters['cached_tokens']:,.0f} / {counters['prompt_tokens']:,.0f} between its "
        f"first and last scrape ({counters['scrapes']} scrapes, {span:.0f} s): "
        + ("no prompt tokens counted" if rate is None else f"hit rate {rate:.1%}")
    )
    if counters.get("note"):
        line += f" ({counters['note']})"
    return line


def prefix_lines(report: Report) -> list[str]:
    """One line per cell with anything known of its prefix cache: off, or its hit rate
    and where it came from, the blocks and prefix tokens evicted, the target's counters."""
    lines = []
    for rr in report.runs:
        for name, p in rr.policies.items():
            pc = p.prefix_cache
            if not pc:
                continue
            cell = f"{rr.run.label}/{name}"
            if pc["enabled"] is False:
                lines.append(f"{cell}: {pc.get('note')} ({pc['enabled_source']})")
                continue
            parts = []
            if pc["hit_rate"] is not None:
                parts.append(f"hit rate {pc['hit_rate']:.1%} (from {pc['source']})")
            elif pc["source"] is None:
                parts.append(f"hit rate {NOT_RECORDED}")
            if pc["evicted_blocks"] is not None:
                parts.append(f"{pc['evicted_blocks']:,} blocks evicted over the run")
            if pc["evicted_prefix_tokens"] is not None:
                parts.append(
                    f"{pc['evicted_prefix_tokens']:,} prompt tokens had been cached and were "
                    "evicted before their admission"
                )
            if pc.get("counters"):
                parts.append(counters_line(pc["counters"]))
            if pc["enabled"] is None:
                parts.append("whether caching was on is not recorded")
            lines.append(f"{cell}: " + "; ".join(parts))
    return lines


def _has_prefix_cache(report: Report) -> bool:
    return any(p.prefix_cache for rr in report.runs for p in rr.policies.values())


SESSION_HEADERS = [
    "run",
    "policy",
    "class",
    "sessions",
    "finished",
    "failed",
    "cut",
    "not started",
    "turns planned",
    "turns sent",
    "turns/session planned",
    "turns/session sent",
    "TTFT p50 turn 1",
    "TTFT p95 turn 1",
    "n turn 1",
    "TTFT p50 later",
    "TTFT p95 later",
    "n later",
    "duration mean",
    "duration p95",
    "n finished",
]
SESSIONS_TEXT = (
    "One row per policy x class of the cells with multi-turn sessions. Sessions: planned, "
    "each exactly one of finished (every turn ok), failed (a turn failed: the session ended "
    "there, its later turns unsent), cut (the run's end cut a turn in flight or left turns "
    "unsent) and not started (no turn sent). Turns: the rows planned and sent, and their mean "
    "per session. TTFT of first turns (turn 1) and later turns (turn >= 2) over the ok turns, "
    "turns cut in flight at their lower bounds (≥), failed turns in none; n: the turns each "
    "is over. Duration of a finished session: its first turn's scheduled send to its last "
    "token; n: the finished sessions it is over (docs/report.md, 'Sessions')."
)
TURN_TEXT = (
    "Hit rate by turn: cached over prompt tokens of the admitted turns with cached_tokens "
    "known, (n) the turns each is over (– (0): none of that turn's rows was admitted: "
    "unsent, cut or rejected); the turns from {tail} on in one bucket, every turn after the "
    "first in the last column."
)


def _session_cells(report: Report) -> Iterator[tuple[str, str, dict]]:
    """(run label, policy, its sessions entry) of every cell with session rows."""
    for rr in report.runs:
        for name, p in rr.policies.items():
            if p.sessions:
                yield rr.run.label, name, p.sessions


def _has_sessions(report: Report) -> bool:
    return next(_session_cells(report), None) is not None


def _session_groups(entry: dict) -> list[tuple[str, dict]]:
    return [("all", entry["overall"]), *entry["by_class"].items()]


def session_rows(report: Report) -> list[list[str]]:
    """The sessions table: per cell with sessions, ``all`` then each class."""
    rows = []
    for label, name, entry in _session_cells(report):
        for cls, g in _session_groups(entry):
            s, t, d = g["sessions"], g["turns"], g["duration_s"]
            first, later = g["ttft_first_s"], g["ttft_later_s"]
            rows.append(
                [
                    label,
                    name,
                    cls,
                    str(s["planned"]),
                    str(s["finished"]),
                    str(s["failed"]),
                    str(s["cut"]),
                    str(s["not_started"]),
                    str(t["planned"]),
                    str(t["sent"]),
                    _num(t["mean_planned"]),
                    _num(t["mean_sent"]),
                    _stat(first, "p50"),
                    _stat(first, "p95"),
                    str(first["count"]),
                    _stat(later, "p50"),
                    _stat(later, "p95"),
                    str(later["count"]),
                    _ms(d["mean"]),
                    _ms(d["p95"]),
                    str(d["count"]),
                ]
            )
    return rows


def _turn_buckets(report: Report) -> list[str]:
    """Every hit-rate bucket any cell has, in turn order."""
    found = {
        b
        for _, _, entry in _session_cells(report)
        for _, g in _session_groups(entry)
        for b in g["hit_rate_by_turn"]
    }
    return sorted(found, key=lambda b: int(b.rstrip("+")))


def turn_headers(report: Report) -> list[str]:
    """The hit-rate-by-turn table's headers: a column per turn bucket, then every later
    turn together (turn 1 is the first turns: its column is theirs)."""
    return ["run", "policy", "class", *[f"turn {b}" for b in _turn_buckets(report)], "turns ≥ 2"]


def _hit_cell(hit: dict | None, note: str | None) -> str:
    """``80.7% (125)``: a hit rate and the turns it is over; "–" where no such turn was
    planned, "– (0)" where none of them was admitted (all unsent, cut or rejected); the
    cell's note ("prefix caching off", "not recorded") where it has no rates."""
    if hit is None:
        return "–"
    if note is not None:
        return f"{note} ({hit['requests']})"
    if hit["hit_rate"] is None:
        return f"– ({hit['requests']})"
    return f"{hit['hit_rate']:.1%} ({hit['requests']})"


def turn_rows(report: Report) -> list[list[str]]:
    """The hit rate by turn: per cell with sessions, ``all`` then each class."""
    buckets = _turn_buckets(report)
    rows = []
    for label, name, entry in _session_cells(report):
        note = entry.get("hit_rate_note")
        for cls, g in _session_groups(entry):
            by = g["hit_rate_by_turn"]
            rows.append(
                [
                    label,
                    name,
                    cls,
                    *[_hit_cell(by.get(b), note) for b in buckets],
                    _hit_cell(g["hit_rate_later"], note),
                ]
            )
    return rows


def session_lines(report: Report) -> list[str]:
    """Per cell, what its later turns gain: TTFT p50 and hit rate against the first
    turns' (the prose line of the Sessions section)."""
    lines = []
    for label, name, entry in _session_cells(report):
        g = entry["overall"]
        first, later = g["ttft_first_s"], g["ttft_later_s"]
        text = (
            f"{label}/{name}: later turns: TTFT p50 {_stat(later, 'p50')} vs "
            f"{_stat(first, 'p50')} on first turns ({later['count']} and {first['count']} "
            "turns); hit rate "
        )
        note = entry.get("hit_rate_note")
        hit_first, hit_later = g["hit_rate_first"], g["hit_rate_later"]
        if note is not None:
            text += note
        else:
            text += (
                f"{_pct(hit_later['hit_rate'])} vs {_pct(hit_first['hit_rate'])} on first "
                f"turns ({hit_later['requests']} and {hit_first['requests']} admitted turns)"
            )
        s = g["sessions"]
        text += (
            f"; {s['finished']} of {s['planned']} sessions finished, {s['failed']} ended by a "
            f"failed turn, {s['cut']} cut by the run's end, {s['not_started']} not started"
        )
        lines.append(text)
    return lines


LADDER_FIGURES = (
    "requests ok / all",
    "TTFT p50",
    "TTFT p95",
    "TTFT n",
    "span",
    "req/s",
    "tok/s",
    "hit rate",
    "hit-rate n",
)
LADDER_TEXT = (
    "The same load at each rung of prefix reuse (the profile's phases with prefix_reuse), "
    "side by side. TTFT over the ok requests (cut ones at their lower bounds, ≥), n the "
    "requests it is over; span: the rung's first scheduled send to its last token; req/s "
    "and tok/s: its ok requests and their output tokens over the span; hit rate: cached "
    "over prompt tokens of its admitted requests with cached_tokens known, n of them "
    "(docs/report.md, 'Cache ladder')."
)


def _ladders(report: Report) -> Iterator[tuple[str, dict]]:
    for rr in report.runs:
        if rr.cache_ladder:
            yield rr.run.label, rr.cache_ladder


def _has_ladder(report: Report) -> bool:
    return next(_ladders(report), None) is not None


def ladder_headers(ladder: dict) -> list[str]:
    return ["run", "policy", "figure", *[r["name"] for r in ladder["rungs"]]]


def ladder_rows(label: str, ladder: dict) -> list[list[str]]:
    """One run's ladder table: per policy, one row per figure, the rungs side by side."""
    rows = []
    names = [r["name"] for r in ladder["rungs"]]
    for name, by_rung in ladder["policies"].items():
        rungs = [by_rung[n] for n in names]
        cells = {
            "requests ok / all": [f"{r['ok']} / {r['requests']}" for r in rungs],
            "TTFT p50": [_stat(r["ttft_s"], "p50") for r in rungs],
            "TTFT p95": [_stat(r["ttft_s"], "p95") for r in rungs],
            "TTFT n": [str(r["ttft_s"]["count"]) for r in rungs],
            "span": [_num(r["span_s"]) + " s" if r["span_s"] is not None else "–" for r in rungs],
            "req/s": [_num(r["throughput_rps"]) for r in rungs],
            "tok/s": [_num(r["output_tokens_per_s"], 0) for r in rungs],
            "hit rate": [
                _pct(r["hit_rate"]) if r["hit_rate_requests"] else NOT_RECORDED for r in rungs
            ],
            "hit-rate n": [str(r["hit_rate_requests"]) for r in rungs],
        }
        rows += [[label, name, figure, *cells[figure]] for figure in LADDER_FIGURES]
    return rows


def ladder_lines(label: str, ladder: dict) -> list[str]:
    """Where the rungs came from, what was left out, and per policy the two ends."""
    rungs = ladder["rungs"]
    lines = [
        f"{label}: {len(rungs)} rungs of profile '{ladder['profile']}' "
        f"({ladder['profile_source']}), read from {ladder['source']}: "
        + ", ".join(f"{r['name']} ({r['prefix_reuse']:.0%})" for r in rungs)
    ]
    lines += [f"{label}/{note}" for note in ladder["notes"]]
    if len(rungs) >= 2:
        low, high = rungs[0]["name"], rungs[-1]["name"]
        for name, by_rung in ladder["policies"].items():
            a, b = by_rung[low], by_rung[high]
            lines.append(
                f"{label}/{name}: {low} → {high}: TTFT p50 {_stat(a['ttft_s'], 'p50')} → "
                f"{_stat(b['ttft_s'], 'p50')}, TTFT p95 {_stat(a['ttft_s'], 'p95')} → "
                f"{_stat(b['ttft_s'], 'p95')}, hit rate {_pct(a['hit_rate'])} → "
                f"{_pct(b['hit_rate'])}"
            )
    return lines


SPEED_BAND_TEXT = (
    "The same schedule simulated again at the fastest and the slowest speed this "
    "machine's fit saw its steps run at: a served run here lands in the range when the "
    'machine runs within the speeds it was seen at (docs/simulator.md, "The speed band").'
)


def _has_speed_band(report: Report) -> bool:
    return next(_speed_bands(report), None) is not None


SIMULATOR_RULE = (
    "Ranking: lowest first, ≈ a tie (two values within {tol:.0%} of each other); a pair of "
    "policies is compared when both sides order it. The ranking matches when at least one pair "
    "is compared and none is reversed (ordered one way served and the other way simulated), "
    "differs when one is, and is undetermined when no pair is compared or a policy has a "
    "value on one side only. "
    "err = (simulated - served) / served."
)


def _tolerance(report: Report) -> float:
    return next(rr.simulator_check["tie_tolerance"] for rr in report.runs if rr.simulator_check)


def _has_simulator_check(report: Report) -> bool:
    return any(rr.simulator_check for rr in report.runs)


def md(text: object) -> str:
    """``text`` as inert Markdown: what a target or a file wrote (error messages, request
    ids, class and cell names, paths) reaches report.md through here, so a GitHub-rendered
    report never carries live HTML. ``&``, ``<`` and ``>`` become entities (Markdown
    renders them as the characters), ``|`` is escaped so it cannot split a table cell, and
    line breaks become spaces so a value cannot start a block of its own."""
    escaped = html.escape(str(text), quote=False).replace("|", "\\|")
    return " ".join(escaped.splitlines())


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(md(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(md(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _html_table(headers: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _findings(report: Report) -> list[dict]:
    return [f for rr in report.runs for p in rr.policies.values() for f in p.findings]


def _undiagnosed_lines(report: Report) -> list[str]:
    """One line per cell the trap rules could not be applied to (its facts unknown)."""
    return [
        f"trap diagnosis not possible for {rr.run.label}/{n}: {p.undiagnosed}"
        for rr in report.runs
        for n, p in rr.policies.items()
        if p.undiagnosed is not None
    ]


def _all_clean(report: Report) -> bool:
    """Whether to say "No known trap flagged": some cell was diagnosed, none flagged."""
    diagnosed = any(p.diagnosed for rr in report.runs for p in rr.policies.values())
    return diagnosed and not _findings(report)


def _verdict_lines(report: Report) -> list[tuple[str, list[str]]]:
    out = []
    for rr in report.runs:
        lines = [v["sentence"] for v in rr.verdicts.values()]
        lines += [c["sentence"] for c in rr.against_fcfs]
        if not lines:
            lines = ["One policy only: nothing to compare."]
        out.append((rr.run.label, lines))
    return out


def _prompt_lines(report: Report) -> list[str]:
    """``prompts: ...`` per cell whose run.json recorded them (one line when every such
    cell sent the same)."""
    known = {
        f"{rr.run.label}/{n}": PromptChoice.from_dict(p.data.prompts).line()
        for rr in report.runs
        for n, p in rr.policies.items()
        if p.data.prompts
    }
    if not known:
        return []
    if len(set(known.values())) == 1:
        return [f"prompts: {next(iter(known.values()))}"]
    return [f"prompts ({cell}): {line}" for cell, line in known.items()]


def _rate_scale_lines(report: Report) -> list[str]:
    """``load: auto:0.8 -> 0.31x ...`` per run whose rates ``--rate-scale auto`` chose
    (its run.json, or a simulation's summary.json, recorded the choice)."""
    lines = []
    for rr in report.runs:
        info = rr.run.info
        recorded = info.get("rate_scale_auto")
        if recorded is None and isinstance(info.get("run_config"), dict):
            recorded = info["run_config"].get("rate_scale_auto")
        chosen = ChosenScale.from_dict(recorded)
        if chosen is not None:
            profile = info.get("profile")
            profile = profile if isinstance(profile, str) else "the profile"
            lines.append(f"load ({rr.run.label}): {chosen.line(profile)}")
    return lines


def _load_lines(report: Report) -> list[str]:
    """Distributed load the report must not hide: a lost worker, an uncertain clock."""
    return [
        f"LOAD ({rr.run.label}/{n}): {note}"
        for rr in report.runs
        for n, p in rr.policies.items()
        for note in p.data.load_notes
    ]


def _error_cells(report: Report, high_only: bool) -> list[tuple[str, dict]]:
    """(cell, its error summary) of the cells with failed requests (those over
    errors.HIGH_ERROR_RATE only, when ``high_only``), the highest rate first."""
    cells = [
        (f"{rr.run.label}/{n}", p.errors)
        for rr in report.runs
        for n, p in rr.policies.items()
        if p.errors.get("failed")
        and (not high_only or p.errors["error_rate"] > errors.HIGH_ERROR_RATE)
    ]
    return sorted(cells, key=lambda c: -c[1]["error_rate"])


def _cut_lines(report: Report) -> list[str]:
    """What the verdicts say first too: the cells whose run ended with requests still in
    flight, by class (those requests are censored, not dropped: their TTFT and E2E enter
    the statistics as lower bounds, shown with ``≥``)."""
    lines = []
    for rr in report.runs:
        for n, p in rr.policies.items():
            overall = p.groups["overall"]
            if not overall.get("cut_in_flight"):
                continue
            by_class = ", ".join(
                f"{g['cut_in_flight']} of {g['requests']} '{cls}'"
                for cls, g in p.groups["classes"].items()
                if g.get("cut_in_flight")
            )
            lines.append(
                f"CUT: {rr.run.label}/{n}: {overall['cut_in_flight']} of {overall['requests']} "
                f"requests were still in flight when the run stopped ({by_class}); they count "
                "as SLO misses and their TTFT and E2E as at least the time they had waited, so "
                "a statistic they can move is a lower bound (≥)"
            )
    return lines


def _high_error_lines(report: Report) -> list[str]:
    """What the verdicts say first: the cells whose error rate is high."""
    return [
        f"HIGH ERROR RATE: {errors.headline(cell, e)}; its latencies and verdicts cover only "
        f"the requests that succeeded (most common: {errors.describe(e['top'][0])})"
        for cell, e in _error_cells(report, high_only=True)
    ]


def _notes(report: Report) -> list[str]:
    notes = []
    for rr in report.runs:
        notes.append(
            f"{rr.run.label}: SLOs from {rr.slo_source}; short class "
            f"'{rr.short_class}', long class '{rr.long_class}'"
        )
        for name, p in rr.policies.items():
            src = ", ".join(f"{k} from {v}" for k, v in p.stall_sources.items())
            if is_external(p.data):
                src += "; an external engine: their causes cannot be known"
            notes.append(
                f"{rr.run.label}/{name}: stall threshold {_ms(p.threshold_s)}"
                + (f" ({p.threshold_note})" if p.threshold_note else "")
                + (f"; stall evidence: {src}" if src else "")
            )
            if p.data.server_source:
                notes.append(f"{rr.run.label}/{name}: {server_source_note(p.data.server_source)}")
    return notes


def server_source_note(source: dict) -> str:
    """Where an external engine's server-side figures came from (its spans), and what
    stays unknown."""
    return (
        f"queue wait (queue p99, queue max) from {source['source']}, "
        f"{source['requests_joined']} of {source['requests']} requests joined; "
        "preemptions are not in them (–)"
    )


def _broken_lines(report: Report) -> list[str]:
    """One line per cell left out because its records cannot be used."""
    return [b.line() for b in report.broken]


def write_markdown(report: Report, path: Path) -> None:
    """report.md; every string from the data goes through :func:`md`."""
    parts = [
        "# schedscope report",
        "",
        "Runs: " + ", ".join(f"**{md(rr.run.label)}** ({md(rr.run.path)})" for rr in report.runs),
        "",
    ]
    prompts = _rate_scale_lines(report) + _prompt_lines(report)
    if prompts:
        parts += [*[f"- {md(line)}" for line in prompts], ""]
    load = _load_lines(report)
    if load:
        parts += [*[f"- **{md(line)}**" for line in load], ""]
    broken = _broken_lines(report)
    if broken:
        parts += ["## Broken cells", "", *[f"- **{md(line)}**" for line in broken], ""]
    if report.missing:
        parts += ["## Missing data", "", *[f"- {md(m)}" for m in report.missing], ""]
    parts += ["## Verdicts", ""]
    high = _high_error_lines(report) + _cut_lines(report)
    if high:  # before any verdict: the verdicts stand on the requests that succeeded
        parts += [*[f"- **{md(line)}**" for line in high], ""]
    for label, lines in _verdict_lines(report):
        parts += [f"**{md(label)}**", "", *[f"- {md(line)}" for line in lines], ""]
    parts += ["## Diagnosis", ""]
    for cell, e in _error_cells(report, high_only=False):
        parts += [f"### {md(errors.headline(cell, e))}", ""]
        parts += [f"- {md(errors.describe(g))}" for g in e["top"]]
        if e.get("other_groups"):
            parts.append(f"- ... and {e['other_groups']} other kind(s) of error")
        parts.append("")
    undiagnosed = _undiagnosed_lines(report)
    if undiagnosed:
        parts += [*[f"- **{md(line)}**" for line in undiagnosed], ""]
    found = _findings(report)
    if _all_clean(report):
        parts += ["No known trap flagged (rules: docs/report.md).", ""]
    for f in found:
        parts += [
            f"### {md(f['run'])}/{md(f['policy'])}: {md(f['title'])} (`{f['trap']}`)",
            "",
            md(f["message"]),
            "",
            f"- knob: {md(f['knob'])}",
            *([f"- command: `{md(f['command'])}`"] if f.get("command") else []),
            "- evidence: " + md(", ".join(f"{k}={v}" for k, v in f["evidence"].items())),
            "- worst requests: "
            + md(
                "; ".join(", ".join(f"{k}={v}" for k, v in w.items()) for w in f["worst_requests"])
            ),
            "",
        ]
    parts += [
        "## Per policy x class",
        "",
        _md_table(CLASS_HEADERS, class_rows(report)),
        "",
        "## Stall time by cause",
        "",
        _md_table(STALL_HEADERS, stall_rows(report)),
        "",
    ]
    if _has_prefix_cache(report):
        parts += ["## Prefix cache", "", *[f"- {md(line)}" for line in prefix_lines(report)], ""]
        rows = prefix_rows(report)
        if rows:
            parts += [_md_table(PREFIX_HEADERS, rows), "", md(PREFIX_TEXT), ""]
    if _has_sessions(report):
        parts += [
            "## Sessions",
            "",
            *[f"- {md(line)}" for line in session_lines(report)],
            "",
            _md_table(SESSION_HEADERS, session_rows(report)),
            "",
            md(SESSIONS_TEXT),
            "",
            _md_table(turn_headers(report), turn_rows(report)),
            "",
            md(TURN_TEXT.format(tail=_tail(report))),
            "",
        ]
    if _has_ladder(report):
        parts += ["## Cache ladder", ""]
        for label, ladder in _ladders(report):
            parts += [
                *[f"- {md(line)}" for line in ladder_lines(label, ladder)],
                "",
                _md_table(ladder_headers(ladder), ladder_rows(label, ladder)),
                "",
            ]
        parts += [
            md(LADDER_TEXT),
            "",
            "Its picture (TTFT and hit rate per rung) is in report.html.",
            "",
        ]
    if _has_simulator_check(report):
        parts += [
            "## Simulator vs this run",
            "",
            "Each served cell's schedule simulated with the cost model this machine had "
            "before the run; a --target cell's with the stored fit of its target "
            "(docs/report.md).",
            "",
            _md_table(SIMULATOR_HEADERS, simulator_rows(report)),
            "",
            *[f"- {md(line)}" for line in simulator_lines(report)],
            "",
            md(SIMULATOR_RULE.format(tol=_tolerance(report))),
            "",
        ]
    if _has_speed_band(report):
        parts += [
            "## Speed band",
            "",
            md(SPEED_BAND_TEXT),
            "",
            _md_table(SPEED_BAND_HEADERS, speed_band_rows(report)),
            "",
            *[f"- {md(line)}" for line in speed_band_lines(report)],
            "",
        ]
    parts += [
        "## Notes",
        "",
        *[f"- {md(n)}" for n in _notes(report)],
        "",
        "Pictures (latency CDFs, queue depth and KV usage, stalls over time, waterfalls of "
        "the slowest requests) are in report.html. Definitions: docs/report.md.",
        "",
    ]
    path.write_text("\n".join(parts))


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:8px 0 20px}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;position:sticky;top:0} td:nth-child(-n+3){text-align:left}
.finding{border-left:4px solid #d62728;padding:6px 12px;margin:10px 0;background:#fff6f6}
.ok{border-left:4px solid #2ca02c;padding:6px 12px;background:#f5fff5}
.missing{border-left:4px solid #ff7f0e;padding:6px 12px;background:#fffaf0}
.wrap{overflow-x:auto} .plot{margin:10px 0 24px} code{background:#f4f4f4;padding:1px 3px}
"""


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def write_html(report: Report, path: Path) -> int:
    """report.html; returns the number of plots in it."""
    e = html.escape
    body = [
        "<h1>schedscope report</h1><p>Runs: "
        + ", ".join(f"<code>{e(rr.run.label)}</code> ({e(str(rr.run.path))})" for rr in report.runs)
        + "</p>"
    ]
    for line in _rate_scale_lines(report):
        body.append(f'<p class="rate-scale">{e(line)}</p>')
    for line in _prompt_lines(report):
        body.append(f'<p class="prompts">{e(line)}</p>')
    for line in _load_lines(report):
        body.append(f'<div class="finding" data-load="distributed"><b>{e(line)}</b></div>')
    broken = _broken_lines(report)
    if broken:
        body.append(
            '<div class="finding" data-broken="cells"><b>Broken cells</b> (left out of the '
            "tables, comparisons and verdicts):<ul>"
            + "".join(f"<li>{e(line)}</li>" for line in broken)
            + "</ul></div>"
        )
    if report.missing:
        body.append(
            '<div class="missing"><b>Missing data</b> (rendered what the rest allows):<ul>'
            + "".join(f"<li>{e(m)}</li>" for m in report.missing)
            + "</ul></div>"
        )
    body.append('<h2 id="verdicts">Verdicts</h2>')
    for line in _high_error_lines(report):
        body.append(f'<div class="finding" data-errors="high"><b>{e(line)}</b></div>')
    for line in _cut_lines(report):
        body.append(f'<div class="finding" data-cut="in-flight"><b>{e(line)}</b></div>')
    for label, lines in _verdict_lines(report):
        body.append(
            f"<p><b>{e(label)}</b></p><ul>" + "".join(f"<li>{e(x)}</li>" for x in lines) + "</ul>"
        )
    body.append('<h2 id="diagnosis">Diagnosis</h2>')
    for cell, errs in _error_cells(report, high_only=False):
        groups = [errors.describe(g) for g in errs["top"]]
        if errs.get("other_groups"):
            groups.append(f"... and {errs['other_groups']} other kind(s) of error")
        body.append(
            f'<div class="finding" data-errors="{e(cell)}"><b>{e(errors.headline(cell, errs))}</b>'
            "<ul>" + "".join(f"<li>{e(x)}</li>" for x in groups) + "</ul></div>"
        )
    for line in _undiagnosed_lines(report):
        body.append(f'<div class="missing" data-undiagnosed="cell">{e(line)}</div>')
    found = _findings(report)
    if _all_clean(report):
        body.append('<div class="ok">No known trap flagged.</div>')
    for f in found:
        worst = "".join(
            "<li>" + e(", ".join(f"{k}={v}" for k, v in w.items())) + "</li>"
            for w in f["worst_requests"]
        )
        body.append(
            f'<div class="finding" data-trap="{e(f["trap"])}"><b>{e(f["run"])}/{e(f["policy"])}: '
            f"{e(f['title'])}</b> (<code>{e(f['trap'])}</code>)<p>{e(f['message'])}</p>"
            f"<p><b>Knob:</b> {e(f['knob'])}</p>"
            + (
                f'<p><b>Command:</b> <code class="command">{e(f["command"])}</code></p>'
                if f.get("command")
                else ""
            )
            + "<p><b>Evidence:</b> "
            + e(", ".join(f"{k}={v}" for k, v in f["evidence"].items()))
            + f"</p><p><b>Worst requests:</b></p><ul>{worst}</ul></div>"
        )
    body.append(
        '<h2 id="classes">Per policy × class</h2><div class="wrap">'
        + _html_table(CLASS_HEADERS, class_rows(report), "classes")
        + "</div>"
    )
    body.append(
        '<h2 id="stalls">Stall time by cause</h2><div class="wrap">'
        + _html_table(STALL_HEADERS, stall_rows(report), "stalls")
        + "</div>"
    )
    if _has_prefix_cache(report):
        rows = prefix_rows(report)
        body.append(
            '<h2 id="prefix-cache">Prefix cache</h2><ul>'
            + "".join(f"<li>{e(line)}</li>" for line in prefix_lines(report))
            + "</ul>"
            + (
                '<div class="wrap">'
                + _html_table(PREFIX_HEADERS, rows, "prefix-cache")
                + f"</div><p>{e(PREFIX_TEXT)}</p>"
                if rows
                else ""
            )
        )
    count = 0
    config = {"displaylogo": False, "responsive": True}
    if _has_sessions(report):
        body.append(
            '<h2 id="sessions">Sessions</h2><ul>'
            + "".join(f"<li>{e(line)}</li>" for line in session_lines(report))
            + '</ul><div class="wrap">'
            + _html_table(SESSION_HEADERS, session_rows(report), "sessions")
            + f"</div><p>{e(SESSIONS_TEXT)}</p>"
            + '<div class="wrap">'
            + _html_table(turn_headers(report), turn_rows(report), "session-turns")
            + f"</div><p>{e(TURN_TEXT.format(tail=_tail(report)))}</p>"
        )
    if _has_ladder(report):
        body.append('<h2 id="cache-ladder">Cache ladder</h2>')
        for label, ladder in _ladders(report):
            body.append(
                "<ul>"
                + "".join(f"<li>{e(line)}</li>" for line in ladder_lines(label, ladder))
                + '</ul><div class="wrap">'
                + _html_table(ladder_headers(ladder), ladder_rows(label, ladder), "cache-ladder")
                + "</div>"
            )
        body.append(f"<p>{e(LADDER_TEXT)}</p>")
        for t, fig in [(t, f) for s, t, f in report.figures if s == "ladder"]:
            count += 1
            body.append(_plot_div("ladder", t, fig, count, config))
    if _has_simulator_check(report):
        body.append(
            '<h2 id="simulator-check">Simulator vs this run</h2><p>Each served cell\'s '
            "schedule simulated with the cost model this machine had before the run; a "
            "--target cell's with the stored fit of its target.</p>"
            '<div class="wrap">'
            + _html_table(SIMULATOR_HEADERS, simulator_rows(report), "simulator-check")
            + "</div><ul>"
            + "".join(f"<li>{e(line)}</li>" for line in simulator_lines(report))
            + f"</ul><p>{e(SIMULATOR_RULE.format(tol=_tolerance(report)))}</p>"
        )
    if _has_speed_band(report):
        body.append(
            f'<h2 id="speed-band">Speed band</h2><p>{e(SPEED_BAND_TEXT)}</p><div class="wrap">'
            + _html_table(SPEED_BAND_HEADERS, speed_band_rows(report), "speed-band")
            + "</div><ul>"
            + "".join(f"<li>{e(line)}</li>" for line in speed_band_lines(report))
            + "</ul>"
        )
    sections = {
        "cdf": "Latency CDFs by class",
        "timeline": "Queue depth, KV usage and arrivals",
        "stalls": "Stalls over time",
        "waterfall": "The slowest requests",
    }
    for section, title in sections.items():
        figs = [(t, f) for s, t, f in report.figures if s == section]
        body.append(f'<h2 id="fig-{section}">{e(title)}</h2>')
        if not figs:
            body.append(f'<p class="missing">No data for this picture ({e(section)}).</p>')
        for t, fig in figs:
            count += 1
            body.append(_plot_div(section, t, fig, count, config))
    body.append(
        "<h2>Notes</h2><ul>"
        + "".join(f"<li>{e(n)}</li>" for n in _notes(report))
        + "</ul><p>Definitions and rules: docs/report.md.</p>"
    )
    page = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>schedscope report</title>'
        f'<style>{CSS}</style><script type="text/javascript">{plotly_js()}</script></head>'
        f'<body data-plots="{count}">' + "\n".join(body) + "</body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return count


def _plot_div(section: str, title: str, fig, count: int, config: dict) -> str:
    """One figure's ``<div>`` (its data and one inline script; plotly.js is in the head)."""
    div = fig.to_html(
        full_html=False, include_plotlyjs=False, config=config, div_id=f"plot-{count}"
    )
    return f'<div class="plot" data-section="{section}" title="{html.escape(title)}">{div}</div>'


def _tail(report: Report) -> str:
    """The first turn of the tail bucket (``6+``) the sessions of the report use."""
    return next(f"{entry['tail_turn']}" for _, _, entry in _session_cells(report))


def write_outputs(report: Report, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "html": out / "report.html",
        "markdown": out / "report.md",
        "summary": out / "summary.json",
        "stalls": out / "stalls.parquet",
        "classes": out / "classes.parquet",
    }
    stall_frames = [
        p.stalls.with_columns(pl.lit(rr.run.label).alias("run"), pl.lit(n).alias("policy"))
        for rr in report.runs
        for n, p in rr.policies.items()
    ]
    pl.concat(stall_frames).select("run", "policy", pl.exclude("run", "policy")).write_parquet(
        paths["stalls"]
    )
    pl.DataFrame(flat_rows(report), infer_schema_length=None).with_columns(
        # typed even when no row has a value (a simulation's: nothing cut, nothing bounded)
        pl.col("n_cut_in_flight").cast(pl.Int64),
        pl.col("lower_bounds").cast(pl.List(pl.String)),
    ).write_parquet(paths["classes"])
    paths["summary"].write_text(json.dumps(summary_json(report), indent=2, sort_keys=True) + "\n")
    write_markdown(report, paths["markdown"])
    write_html(report, paths["html"])
    return paths
