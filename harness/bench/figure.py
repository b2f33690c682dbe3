"""One measured figure of a benchmark, beside its target: what every benchmark under
``benchmarks/`` returns (docs/benchmarks.md, "The contract").

A figure is met when its value is on the right side of its target (``better``: lower
or higher is better; equal counts as met), missed when not, and has no verdict when it
has no target or was not measured (``value`` None, NaN or infinite: a ratio over a base
of 0 measured nothing). The aim, where a benchmark
states one, is a second, harder bound judged the same way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

Better = Literal["lower", "higher"]

MET, MISSED, NO_TARGET, NOT_MEASURED = "met", "missed", "no target", "not measured"


class FigureError(ValueError):
    """A figure (or a figures file) that breaks the contract."""


def meets(value: float, bound: float, better: Better) -> bool:
    """Is ``value`` on the good side of ``bound`` (equal is good)?"""
    if better == "lower":
        return value <= bound
    if better == "higher":
        return value >= bound
    raise FigureError(f"better must be 'lower' or 'higher', not {better!r}")


@dataclass(frozen=True)
class Figure:
    """``value`` in ``unit`` (say "ms", "x", "%", "tokens/s"), with the ``target`` (and
    ``aim``) the benchmark prints beside it, in the same unit; ``note`` is anything the
    benchmark prints with it (the size measured, the figure before a fix)."""

    name: str
    value: float | None
    unit: str = ""
    target: float | None = None
    better: Better = "lower"
    aim: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise FigureError("a figure needs a name")
        if self.better not in ("lower", "higher"):
            raise FigureError(f"{self.name}: better must be 'lower' or 'higher'")
        if self.aim is not None and self.target is None:
            raise FigureError(f"{self.name}: an aim without a target")

    @property
    def measured(self) -> bool:
        """A finite value: None, NaN and infinity read as not measured."""
        return self.value is not None and math.isfinite(self.value)

    @property
    def met(self) -> bool | None:
        """True or False against the target; None without a target or a value."""
        if self.target is None or not self.measured:
            return None
        return meets(float(self.value), self.target, self.better)  # type: ignore[arg-type]

    @property
    def aim_met(self) -> bool | None:
        if self.aim is None or not self.measured:
            return None
        return meets(float(self.value), self.aim, self.better)  # type: ignore[arg-type]

    @property
    def verdict(self) -> str:
        """met, missed, no target or not measured."""
        if not self.measured:
            return NOT_MEASURED
        met = self.met
        return NO_TARGET if met is None else MET if met else MISSED

    def to_dict(self) -> dict:
        """The fields, plus ``met``, ``aim_met`` and ``verdict`` (recomputed on load)."""
        out = asdict(self)
        if self.value is not None and not math.isfinite(self.value):
            out["value"] = None  # JSON has no NaN nor infinity
        return {**out, "met": self.met, "aim_met": self.aim_met, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: dict) -> Figure:
        try:
            return cls(
                name=data["name"],
                value=None if data["value"] is None else float(data["value"]),
                unit=data.get("unit", ""),
                target=data.get("target"),
                better=data.get("better", "lower"),
                aim=data.get("aim"),
                note=data.get("note", ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FigureError(f"not a figure: {data!r} ({exc})") from None


def bound_text(bound: float | None, better: Better, unit: str) -> str:
    """ "<= 1.3x", ">= 10,000 tokens/s", "" without a bound."""
    if bound is None:
        return ""
    sign = "<=" if better == "lower" else ">="
    return f"{sign} {bound:,g}{unit_suffix(unit)}"  # as the benchmark states it


def value_text(figure: Figure) -> str:
    if not figure.measured:
        return "-"
    return f"{number_text(float(figure.value))}{unit_suffix(figure.unit)}"  # type: ignore[arg-type]


def unit_suffix(unit: str) -> str:
    return unit if unit in ("x", "%") else f" {unit}" if unit else ""


def number_text(value: float) -> str:
    """Three significant digits, thousands separated: 0.0123, 1.24, 13.4, 4,779."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= 2:
        return f"{value:,.0f}"
    return f"{value:.{2 - magnitude}f}"
