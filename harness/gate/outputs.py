"""What the gate writes: a Markdown table (the console, ``$GITHUB_STEP_SUMMARY``), JUnit
XML (one test case per line, a failure per failing line) and JSON."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.gate.evaluate import Check, tolerance_text
from harness.records.request_stats import clean

HEADER = ("", "rule", "cell", "class", "metric", "baseline", "current", "change", "interval",
          "limit", "detail")  # fmt: skip


#: Characters XML 1.0 cannot hold (control characters but tab, newline, return).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _xml(text: str) -> str:
    return _NOT_XML.sub("?", text)


def _cell(text: str) -> str:
    """A Markdown table cell: no pipe, no line break."""
    return text.replace("|", "/").replace("\n", " ")


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"


def _limit(check: Check) -> str:
    if check.limit is None:
        return "–"
    if check.kind == "regression":
        return f"≤ +{tolerance_text(check.limit)}"
    if check.kind == "exact":
        return "identical"
    return f"{'≤' if check.kind == 'ceiling' else '≥'} {check.limit:g}"


def _interval(check: Check) -> str:
    if check.interval is None or check.method != "bootstrap":
        return "exact" if check.method == "exact" and check.kind == "regression" else "–"
    return f"[{check.interval[0]:+.1%}, {check.interval[1]:+.1%}]"


def verdict_line(checks: list[Check], exit_code: int) -> str:
    failed = sum(not c.passed for c in checks)
    open_lines = sum(c.inconclusive for c in checks)
    if exit_code == 0:
        also = f"; {open_lines} with no baseline value" if open_lines else ""
        return f"gate: PASS ({len(checks)} checks{also})"
    return f"gate: FAIL ({failed} of {len(checks)} checks failed)"


def kind_line(kind: str) -> str:
    """Which kind of regression a failed gate saw (harness/gate/diagnosis.py)."""
    return f"gate: regression kind: {kind}"


def markdown(
    checks: list[Check], notes: list[str], exit_code: int, title: str, kind: str | None = None
) -> str:
    """The gate's table, failing lines first."""
    lines = [f"### {title}", "", f"**{verdict_line(checks, exit_code)}**", ""]
    if kind:
        lines[-1:] = ["", f"**{kind_line(kind)}**", ""]
    lines += [f"- {n}" for n in notes]
    if notes:
        lines.append("")
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "---|" * len(HEADER))
    for c in sorted(checks, key=lambda c: c.passed):
        cells = (
            "➖" if c.inconclusive else ("✅" if c.passed else "❌"),
            c.rule,
            c.cell,
            c.klass,
            c.metric,
            _number(c.baseline),
            _number(c.current),
            _percent(c.change),
            _interval(c),
            _limit(c),
            c.message,
        )
        lines.append("| " + " | ".join(_cell(str(c)) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def failure_lines(checks: list[Check]) -> list[str]:
    """One line per failing check: rule, metric, baseline vs current, interval, tolerance."""
    out = []
    for c in checks:
        if c.passed:
            continue
        out.append(
            f"FAIL {c.rule}: {c.cell}/{c.klass} {c.metric}: baseline {_number(c.baseline)}, "
            f"current {_number(c.current)}, change {_percent(c.change)}, interval "
            f"{_interval(c)}, limit {_limit(c)} — {c.message}"
        )
    return out


def junit(checks: list[Check], path: Path, name: str = "schedscope gate") -> None:
    """JUnit XML: a test suite of one test case per line (``classname`` the cell)."""
    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(checks)),
        failures=str(sum(not c.passed for c in checks)),
        errors="0",
        skipped=str(sum(c.inconclusive for c in checks)),
    )
    for c in checks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=_xml(f"gate.{c.cell}"),
            name=_xml(f"{c.rule} {c.klass} {c.metric}"),
        )
        if c.inconclusive:
            ET.SubElement(case, "skipped", message=_xml(c.message))
        elif not c.passed:
            failure = ET.SubElement(case, "failure", message=_xml(c.message), type=c.kind)
            failure.text = _xml("\n".join(failure_lines([c])))
        else:
            ET.SubElement(case, "system-out").text = _xml(c.message)
    root = ET.Element("testsuites", name=name)
    root.append(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def as_json(
    checks: list[Check],
    notes: list[str],
    exit_code: int,
    sides: dict,
    regression: dict | None = None,
) -> dict:
    """``regression``: the diagnosis (``Diagnosis.to_dict``: kind, lines, simulated)."""
    return {
        "kind": "schedscope-gate",
        "version": 1,
        "result": "pass" if exit_code == 0 else "fail",
        "exit_code": exit_code,
        "regression": regression,
        "notes": notes,
        "sides": sides,
        "checks": [
            {
                "rule": c.rule,
                "cell": c.cell,
                "class": c.klass,
                "metric": c.metric,
                "kind": c.kind,
                "method": c.method,
                "limit": clean(c.limit),
                "baseline": clean(c.baseline),
                "current": clean(c.current),
                "change": clean(c.change),
                "interval": [clean(c.interval[0]), clean(c.interval[1])] if c.interval else None,
                "passed": c.passed,
                "inconclusive": c.inconclusive,
                "message": c.message,
            }
            for c in checks
        ],
    }


def write_json(body: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")
