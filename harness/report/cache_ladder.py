"""The cache ladder of a run (docs/report.md, "Cache ladder"): one load at several levels
of prefix reuse — the profile's rungs, phases with ``prefix_reuse`` (the shipped
``cache_ladder``: ``reuse_0`` ... ``reuse_90``) — measured side by side per policy.

**Which phases are rungs.** The run's profile, read as the report reads it for its SLOs
(its summary.json, run config or requests.parquet ``profile``; ``--profile`` last, since
the rows' ``phase`` numbers index the run's own profile): its phases with a
``prefix_reuse``, in the profile's order. A profile none of whose phases has one but
whose phase names read ``reuse_<pct>`` (a profile written without the field, or an older
one of the same name) gives rungs from the names, ``<pct>`` / 100, and ``source`` says
so. Without a readable profile the rows carry phase numbers only, not names: no ladder.

**Per rung and policy** (the rung's rows: ``phase`` equal to the rung's index):

- ``requests`` (every row of the phase, sent or not), ``ok``;
- ``ttft_s``: TTFT over the ``ok`` rows, with the rows cut in flight at their lower
  bounds (censored, as every latency of the report); failed rows in no percentile;
- ``span_s``: from the rung's first ``scheduled_at`` to the last token of its last
  ``ok`` request (``scheduled_at`` + ``e2e_s``): the time its own load took to serve,
  its tail in the next rung included (rungs are back to back, so a rung's window alone
  would count the previous rung's stragglers in it and its own out);
- ``throughput_rps`` and ``output_tokens_per_s``: the ``ok`` requests and their output
  tokens over ``span_s`` (null when the span is not known or 0);
- ``hit_rate``: Σ ``cached_tokens`` / Σ ``prompt_tokens`` over the rung's admitted rows
  with ``cached_tokens`` known (:func:`harness.report.prefix_cache.admitted_known`),
  ``hit_rate_requests`` of them; null when none, or when the cell ran without the cache.

:func:`cache_ladder` gives summary.json's ``cache_ladder`` of one run, or None when its
profile has no rungs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from harness.profiles import Profile
from harness.records.polars_types import as_float, as_int
from harness.records.request_stats import censored_metric, clean, rate
from harness.report.prefix_cache import CACHING_OFF, admitted_known

#: A phase name that is a rung when the profile's phases carry no ``prefix_reuse``.
RUNG_NAME = re.compile(r"reuse_(\d{1,2})")
#: ``source`` of rungs read from the phases' ``prefix_reuse``.
FROM_PREFIX_REUSE = "the phases' prefix_reuse"
#: ``source`` of rungs read from the phase names.
FROM_NAMES = "the phase names (reuse_<pct>: the profile's phases carry no prefix_reuse)"


@dataclass(frozen=True)
class Rung:
    """One rung: the profile phase (its index, as the rows' ``phase``), its name, and
    the share of each prompt that repeats the rung's shared document."""

    phase: int
    name: str
    prefix_reuse: float

    def to_dict(self) -> dict:
        return {"phase": self.phase, "name": self.name, "prefix_reuse": self.prefix_reuse}


def rungs(profile: Profile) -> tuple[list[Rung], str | None]:
    """(the profile's rungs in phase order, where they were read from: one of
    :data:`FROM_PREFIX_REUSE`, :data:`FROM_NAMES`); ([], None) when it has none."""
    found = [
        Rung(i, p.name, float(p.prefix_reuse))
        for i, p in enumerate(profile.phases)
        if p.prefix_reuse is not None
    ]
    if found:
        return found, FROM_PREFIX_REUSE
    named = []
    for i, p in enumerate(profile.phases):
        match = RUNG_NAME.fullmatch(p.name)
        if match:
            named.append(Rung(i, p.name, int(match.group(1)) / 100))
    return named, (FROM_NAMES if named else None)


def rung_stats(rows: pl.DataFrame, caching: bool | None) -> dict:
    """One rung's figures over its ``rows`` (module docstring)."""
    ok = rows.filter(pl.col("status") == "ok")
    ttft = censored_metric(rows, "ttft_s")
    start = rows["scheduled_at"].min()
    end = ok.select((pl.col("scheduled_at") + pl.col("e2e_s")).max()).item() if ok.height else None
    span = as_float(end) - as_float(start) if end is not None and start is not None else None
    known = admitted_known(rows)
    prompt = int(known["prompt_tokens"].sum()) if known.height else 0
    cached = int(known["cached_tokens"].sum()) if known.height else 0
    has_rate = known.height > 0 and prompt > 0 and caching is not False
    return {
        "requests": rows.height,
        "ok": ok.height,
        "ttft_s": ttft,
        "span_s": clean(span),
        "throughput_rps": rate(ok.height, span) if span is not None else None,
        "output_tokens_per_s": (
            rate(float(ok["output_tokens"].sum()), span) if span is not None else None
        ),
        "hit_rate": clean(cached / prompt) if has_rate else None,
        "hit_rate_requests": known.height,
        "prompt_tokens": prompt if known.height else None,
        "cached_tokens": cached if known.height else None,
    }


def cache_ladder(
    profile: Profile | None,
    profile_source: str | None,
    cells: dict[str, tuple[pl.DataFrame, bool | None]],
) -> dict | None:
    """summary.json's ``cache_ladder`` of one run: ``cells`` is cell name -> (its
    request rows, :func:`harness.report.tables.load_requests`; whether it ran with the
    prefix cache, None: not recorded). None when ``profile`` is None or has no rungs.
    A cell whose rows carry no ``phase`` or phases the profile does not have gets no
    figures, and ``notes`` says so."""
    if profile is None:
        return None
    found, source = rungs(profile)
    if not found:
        return None
    policies: dict[str, dict] = {}
    notes: list[str] = []
    for name, (frame, caching) in cells.items():
        phases = frame["phase"].drop_nulls()
        if phases.len() == 0:
            notes.append(f"{name}: requests.parquet has no phase: its rungs cannot be told apart")
            continue
        last = as_int(phases.max())
        if last >= len(profile.phases):
            notes.append(
                f"{name}: its rows have phase {last}, profile '{profile.name}' has "
                f"{len(profile.phases)} phases: not its profile"
            )
            continue
        policies[name] = {
            r.name: rung_stats(frame.filter(pl.col("phase") == r.phase), caching) for r in found
        }
        outside = frame.filter(~pl.col("phase").is_in([r.phase for r in found]).fill_null(False))
        if outside.height:  # a warm-up phase, say: counted here, in no rung
            notes.append(
                f"{name}: {outside.height} row(s) of phases that are not rungs: in no rung"
            )
        if caching is False:
            notes.append(f"{name}: {CACHING_OFF}: no hit rates")
    return {
        "profile": profile.name,
        "profile_source": profile_source,
        "source": source,
        "rungs": [r.to_dict() for r in found],
        "policies": policies,
        "notes": notes,
    }
