"""What ``schedscope tune`` writes into its directory: ``tune.json`` (everything),
``tune.md`` (the ranked table, the winner's command lines, the traps, predicted vs
measured) and ``tune.html`` (the same with the Pareto front as a plot, drawn by the
report's figure code: :func:`harness.report.figures.tradeoff_front`). docs/tune.md
lists the keys and columns."""

from __future__ import annotations

import html
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from harness.profiles.rate_scale import ChosenScale
from harness.serve.knobs import flag_name, knob_defaults, knob_flags
from harness.serve.vllm_flags import V1_FIXED, VLLM_KNOBS, VLLM_POLICIES
from harness.tune.confirm import LAUNCH_FAILED, NO_DATA, Confirmed
from harness.tune.front import front_axes
from harness.tune.objective import CAPACITY, Evaluation
from harness.tune.search import SearchResult
from harness.tune.slo import Target


@dataclass
class Outcome:
    """Everything one tune produced (the CLI fills it; the writers read it)."""

    profile: str
    duration_scale: float
    seed: int | None
    objective: str
    targets: list[Target]
    space: list[str]
    cost_model: str
    search: SearchResult
    search_seed: int
    ranked: list[Evaluation]
    front: list[int]  # indices into ranked
    #: label (c1.., current, r1..) -> its evaluation
    finalists: dict[str, Evaluation]
    #: label -> trap findings in the simulator at the profile's rate
    traps: dict[str, list[dict]] = field(default_factory=dict)
    confirmed: list[Confirmed] = field(default_factory=list)
    confirm_root: str | None = None
    #: the factor the searched profile's rates carry (--rate-scale; 1: its own rates)
    rate_scale: float = 1.0
    #: what --rate-scale auto chose (ChosenScale.to_dict; None: an absolute scale)
    rate_scale_auto: dict | None = None

    @property
    def searched(self) -> list[str]:
        return [s.split(":", 1)[0] for s in self.space]


def serve_command(knobs: dict) -> str:
    """The ``schedscope serve`` command line for ``knobs`` (only what differs from the
    defaults)."""
    return shlex.join(["schedscope", "serve", *knob_flags(knobs, with_policy=True)])


def vllm_command(knobs: dict) -> tuple[str, list[str]]:
    """(``vllm serve MODEL`` with the knobs vLLM takes, the knobs it has no flag for)."""
    defaults = knob_defaults()
    flags: list[str] = []
    left: list[str] = []
    for name, value in knobs.items():
        if value is None or value == defaults.get(name) or name == "model":
            continue
        if name in V1_FIXED and value == V1_FIXED[name]:
            continue  # what vLLM V1 does anyway
        if name not in VLLM_KNOBS or (name == "scheduling_policy" and value not in VLLM_POLICIES):
            left.append(f"{flag_name(name)} {value}")
            continue
        flags += knob_flags({name: value}, with_policy=True)
    return shlex.join(["vllm", "serve", "MODEL", *flags]), left


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _value_title(objective: str) -> str:
    return (
        "capacity under SLO (x the profile's rate)" if objective == CAPACITY else "goodput (req/s)"
    )


def ranked_headers(outcome: Outcome, knob_columns: bool = True) -> list[str]:
    """The ranked table's columns: the knobs searched one column each, or (not
    ``knob_columns``: the console's) one column of their flags."""
    axes = front_axes(outcome.targets)
    return [
        "rank",
        "capacity" if outcome.objective == CAPACITY else "goodput/s",
        "meets at 1x",
        *[f"{c} {n}" for c, n in axes],
        "front",
        *(outcome.searched if knob_columns else ["knobs (vs the current)"]),
    ]


def ranked_rows(outcome: Outcome, limit: int = 15, knob_columns: bool = True) -> list[list[str]]:
    axes = front_axes(outcome.targets)
    rows = []
    entries = [("current", outcome.search.current)] + [
        (str(i + 1), e) for i, e in enumerate(outcome.ranked[:limit])
    ]
    front = {id(outcome.ranked[i]) for i in outcome.front}
    for label, e in entries:
        rows.append(
            [
                label,
                _num(e.value),
                "yes" if e.meets_at_profile_rate else "no",
                *[_num(e.tails.get(c, {}).get(n)) for c, n in axes],
                "*" if id(e) in front else "",
                *(
                    [_num(e.knobs.get(k)) for k in outcome.searched]
                    if knob_columns
                    else [_changed_flags(e.knobs, outcome.search.current.knobs)]
                ),
            ]
        )
    return rows


def _changed_flags(knobs: dict, current: dict) -> str:
    changed = {k: v for k, v in knobs.items() if v != current.get(k)}
    return " ".join(_flags(changed)) or "(the current)"


def _flags(knobs: dict) -> list[str]:
    """Every knob given as a flag, defaults included (unlike knob_flags)."""
    out = []
    for name, value in knobs.items():
        if isinstance(value, bool):
            out.append(flag_name(name) if value else f"--no-{name.replace('_', '-')}")
        elif value is None:
            out.append(f"{flag_name(name)} none")
        else:
            out += [flag_name(name), _num(value)]
    return out


def confirm_headers(outcome: Outcome) -> list[str]:
    axes = front_axes(outcome.targets)
    return [
        "config",
        "rate",
        "cell",
        "predicted meets",
        "measured meets",
        *[f"{c} {n} pred / meas" for c, n in axes],
        "goodput pred / meas",
        "flag",
    ]


def confirm_rows(outcome: Outcome) -> list[list[str]]:
    axes = front_axes(outcome.targets)
    rows = []
    for conf in outcome.confirmed:
        pred = conf.predicted
        for rate, m in sorted(conf.measured.items()):
            capacity = pred.get("capacity")
            # the served rate is the capacity rounded to 3 significant digits
            at_capacity = bool(capacity) and abs(rate / capacity - 1) < 5e-3
            tails = (pred.get("tails_at_capacity") if at_capacity else None) or (
                pred.get("tails") if rate == 1.0 else {}
            )
            rows.append(
                [
                    conf.label,
                    f"{rate:g}",
                    m["cell"] or "-",  # none served: its engine did not start
                    "yes" if m["predicted_meets"] else "no",
                    _measured_meets(m),
                    *[
                        f"{_num((tails or {}).get(c, {}).get(n))} / "
                        f"{_num(m.get('tails', {}).get(c, {}).get(n))}"
                        for c, n in axes
                    ],
                    f"{_num(pred.get('goodput_rps')) if rate == 1.0 else '-'} / "
                    f"{_num(m.get('goodput_rps'))}",
                    "MISSED" if rate in conf.missed else "",
                ]
            )
    return rows


def _measured_meets(m: dict) -> str:
    """yes, no, or "no data" for a cell that wrote no summary.json (neither)."""
    if m.get("status") == LAUNCH_FAILED:
        return LAUNCH_FAILED
    if m.get("status") == NO_DATA or m.get("meets") is None:
        return NO_DATA
    return "yes" if m["meets"] else "no"


def _no_data_rates(c: Confirmed) -> list[float]:
    return [
        r for r, m in sorted(c.measured.items()) if _measured_meets(m) in (NO_DATA, LAUNCH_FAILED)
    ]


def off_by_text(c: Confirmed) -> str:
    """How far off the simulator was, as far as the served rates can tell: "+0% to +15%"
    when the true capacity is bracketed by a rate that met and one that missed."""
    low, high = c.off_by_range or (None, c.off_by)
    if low is None or high is None or f"{low:+.0%}" == f"{high:+.0%}":
        return f"{c.off_by:+.0%}" + ("" if low is not None else " or less")
    return f"{low:+.0%} to {high:+.0%}"


def confirm_lines(outcome: Outcome) -> list[str]:
    """One sentence per confirmed configuration: measured capacity, how far off the
    simulator was, and a flag for a missed SLO."""
    lines = []
    for c in outcome.confirmed:
        no_data = _no_data_rates(c)
        measured = len(no_data) < len(c.measured)
        if outcome.objective == CAPACITY:
            line = f"{c.label}: predicted capacity {_num(c.predicted.get('capacity'))}x, " + (
                f"measured {_num(c.measured_capacity)}x (the highest rate served that met "
                "every SLO)"
                if measured
                else "not measured (no cell served gave data)"
            )
        else:
            line = f"{c.label}: predicted goodput {_num(c.predicted.get('value'))} req/s"
            if not measured:
                line += ", not measured (no cell served gave data)"
        if no_data and measured:
            line += (
                f"; no data at {', '.join(f'{r:g}x' for r in no_data)} (the cell wrote no "
                "summary.json: neither met nor missed)"
            )
        if c.launch and c.launch["status"] != "ok":
            line += f"; its engine did not start (`{c.launch['command']}`: {c.launch['log']})"
        elif c.launch:
            line += f"; served on `{c.launch['command']}`"
        if c.off_by is not None:
            line += f"; the simulator was off by {off_by_text(c)}"
        if c.missed:
            line += (
                f"; FLAGGED: the simulator said it meets the SLOs at "
                f"{', '.join(f'{r:g}x' for r in c.missed)} and the served run missed"
            )
        lines.append(line)
    return lines


def to_json(outcome: Outcome) -> dict:
    def ev(e: Evaluation) -> dict:
        return {
            "value": e.value,
            "capacity": e.capacity,
            "meets_at_profile_rate": e.meets_at_profile_rate,
            "tails": e.tails,
            "tails_at_capacity": e.tails_at_capacity,
            "goodput_rps": e.goodput_rps,
            "simulations": e.simulations,
            "knobs": {k: e.knobs.get(k) for k in outcome.searched},
        }

    winner = outcome.finalists.get("c1")
    return {
        "kind": "schedscope-tune",
        "profile": outcome.profile,
        "duration_scale": outcome.duration_scale,
        "rate_scale": outcome.rate_scale,
        "rate_scale_auto": outcome.rate_scale_auto,
        "seed": outcome.seed,
        "search_seed": outcome.search_seed,
        "objective": outcome.objective,
        "slos": [
            {"class": t.class_name, "target": t.name, "limit_s": t.limit_s} for t in outcome.targets
        ],
        "space": outcome.space,
        "cost_model": outcome.cost_model,
        "search": {
            "trials": len(outcome.search.trials),
            "skipped": dict(outcome.search.skipped),
            "elapsed_s": round(outcome.search.elapsed_s, 3),
            "stopped_by": outcome.search.stopped_by,
            "simulations": sum(e.simulations for e in outcome.ranked),
        },
        "current": ev(outcome.search.current),
        "ranked": [ev(e) for e in outcome.ranked],
        "front": outcome.front,
        "finalists": {label: ev(e) for label, e in outcome.finalists.items()},
        "winner": (
            {
                "knobs": winner.knobs,
                "serve": serve_command(winner.knobs),
                "vllm": vllm_command(winner.knobs)[0],
                "vllm_missing": vllm_command(winner.knobs)[1],
            }
            if winner
            else None
        ),
        "traps": outcome.traps,
        "confirm": {
            "root": outcome.confirm_root,
            "configurations": [c.to_dict() for c in outcome.confirmed],
            "flagged": [c.label for c in outcome.confirmed if c.missed],
        }
        if outcome.confirmed
        else None,
    }


def _trap_lines(outcome: Outcome) -> list[str]:
    lines = []
    for label, findings in outcome.traps.items():
        if not findings:
            lines.append(f"{label}: no known trap")
        for f in findings:
            lines.append(f"{label}: {f['trap']} — {f['message']} Knob: {f['knob']}")
    return lines


def _winner_lines(outcome: Outcome) -> list[str]:
    winner = outcome.finalists.get("c1")
    if winner is None:
        return ["No configuration met the SLOs at any rate searched."]
    vllm, left = vllm_command(winner.knobs)
    lines = [f"schedscope: `{serve_command(winner.knobs)}`", f"vLLM: `{vllm}`"]
    if left:
        lines.append("vLLM has no flag for: " + ", ".join(f"`{x}`" for x in left))
    return lines


def _rate_scale_lines(outcome: Outcome) -> list[str]:
    """The load the rates are multiples of, when it is not the profile's own."""
    chosen = ChosenScale.from_dict(outcome.rate_scale_auto)
    if chosen is not None:
        return [
            f"Rates are multiples of the profile at {chosen.factor:.3g}x: "
            + chosen.line(outcome.profile),
            "",
        ]
    if outcome.rate_scale != 1.0:
        return [
            f"Rates are multiples of the profile at {outcome.rate_scale:g}x (--rate-scale).",
            "",
        ]
    return []


def write_markdown(outcome: Outcome, path: Path) -> None:
    from harness.report.render import _md_table

    doc = [
        f"# schedscope tune: {outcome.profile}",
        "",
        f"Objective: {_value_title(outcome.objective)}; SLOs: "
        + ", ".join(f"{t.class_name}:{t.spec()}" for t in outcome.targets)
        + f"; {len(outcome.search.trials)} trials in {outcome.search.elapsed_s:.0f} s "
        f"(stopped by {outcome.search.stopped_by}); cost model: {outcome.cost_model}.",
        "",
        *_rate_scale_lines(outcome),
        "## Winner",
        "",
        *[f"- {line}" for line in _winner_lines(outcome)],
        "",
        "## Ranked",
        "",
        _md_table(ranked_headers(outcome), ranked_rows(outcome)),
        "",
        "Skipped suggestions: "
        + ("; ".join(f"{n} x {r}" for r, n in outcome.search.skipped.most_common()) or "none"),
        "",
        "## Traps (simulated at the profile's rate)",
        "",
        *[f"- {line}" for line in _trap_lines(outcome)],
    ]
    if outcome.confirmed:
        doc += [
            "",
            "## Predicted vs measured",
            "",
            f"Served in {outcome.confirm_root}.",
            "",
            _md_table(confirm_headers(outcome), confirm_rows(outcome)),
            "",
            *[f"- {line}" for line in confirm_lines(outcome)],
        ]
    path.write_text("\n".join(doc) + "\n")


def front_points(outcome: Outcome) -> list[dict]:
    front = set(outcome.front)
    points = [
        {
            "label": f"#{i + 1}",
            "value": e.value,
            "tails": e.tails,
            "kind": "front" if i in front else "trial",
        }
        for i, e in enumerate(outcome.ranked)
    ]
    cur = outcome.search.current
    points.append({"label": "current", "value": cur.value, "tails": cur.tails, "kind": "current"})
    return points


def write_html(outcome: Outcome, path: Path) -> None:
    from harness.report.figures import tradeoff_front
    from harness.report.render import CSS, _html_table, plotly_js

    e = html.escape

    def table(headers, rows, cls):
        return f'<div class="wrap">{_html_table(headers, rows, cls)}</div>'

    fig = tradeoff_front(
        front_points(outcome),
        front_axes(outcome.targets),
        _value_title(outcome.objective),
        "Pareto front: capacity against each class's tail latency",
    )
    plot = fig.to_html(full_html=False, include_plotlyjs=False, div_id="plot-front")
    body = [
        f"<h1>schedscope tune: {e(outcome.profile)}</h1>",
        "<ul>" + "".join(f"<li>{e(x)}</li>" for x in _winner_lines(outcome)) + "</ul>",
        '<h2 id="front">Pareto front</h2>',
        f'<div class="plot" data-section="front">{plot}</div>',
        '<h2 id="ranked">Ranked</h2>',
        table(ranked_headers(outcome), ranked_rows(outcome), "ranked"),
        '<h2 id="traps">Traps</h2>',
        "<ul>" + "".join(f"<li>{e(x)}</li>" for x in _trap_lines(outcome)) + "</ul>",
    ]
    if outcome.confirmed:
        body += [
            '<h2 id="confirm">Predicted vs measured</h2>',
            table(confirm_headers(outcome), confirm_rows(outcome), "confirm"),
            "<ul>" + "".join(f"<li>{e(x)}</li>" for x in confirm_lines(outcome)) + "</ul>",
        ]
    page = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>schedscope tune</title>'
        f'<style>{CSS}</style><script type="text/javascript">{plotly_js()}</script></head>'
        "<body>" + "\n".join(body) + "</body></html>"
    )
    path.write_text(page, encoding="utf-8")


def write_outputs(outcome: Outcome, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "tune.json", "markdown": out / "tune.md", "html": out / "tune.html"}
    paths["json"].write_text(json.dumps(to_json(outcome), indent=2, default=str) + "\n")
    write_markdown(outcome, paths["markdown"])
    write_html(outcome, paths["html"])
    return paths
