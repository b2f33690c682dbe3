"""Request traces to replay: arrival times and prompt/output lengths from CSV or JSONL.

A `ReplayTrace` names a file and how to read it; constructing one reads the file
(as an empirical length file is read), so an unreadable or malformed trace fails when
the profile loads, with the file, line and column in the message.

Column layouts (picked from the header, or forced with `format`):

- ``azure`` — the Azure LLM inference traces: ``TIMESTAMP`` (a datetime string such
  as ``2023-11-16 18:15:46.6805900``, any number of fractional digits, read exactly),
  ``ContextTokens``, ``GeneratedTokens``.
- ``burstgpt`` — BurstGPT: ``Timestamp`` (seconds, float), ``Request tokens``,
  ``Response tokens``; its ``Model`` and ``Log Type`` columns can filter rows
  (`model`, `log_type`) and are otherwise ignored.
- ``plain`` — ``arrival_s`` (or ``timestamp``; seconds, float), ``prompt_tokens``,
  ``output_tokens``, optional ``class``.
- ``mooncake`` — the Mooncake / Kimi traces (JSONL): ``timestamp`` (milliseconds),
  ``input_length``, ``output_length``, ``hash_ids`` (a list of integers: prompt block
  ``i`` — ``hash_block_tokens`` tokens, 512 in the public traces — is the block whose id
  is ``hash_ids[i]``). Requests that share a hash id share that block of their prompt,
  token for token (``hash_ids``), so the trace's prefix structure reaches the prefix
  cache; a prompt longer than its blocks ends in tokens of its own, a shorter one cuts
  its last block.

Rows with 0 prompt or 0 output tokens (failed requests, as BurstGPT logs them) are
skipped and counted in `num_skipped`; other columns are ignored. Arrivals are sorted
(stably) by time. `start_s` skips the first seconds of the trace (trace time), `limit`
keeps at most that many requests after it; offsets are then taken from the first kept
arrival and divided by `time_scale` (2.0 replays twice as fast).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from harness.profiles.errors import ProfileError, check_int, check_name, check_number

FORMATS = ("auto", "azure", "burstgpt", "plain", "mooncake")
#: Tokens per hash id in the public Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512
#: The most hash ids one request may name (a prompt of 8M tokens at 512 per block).
MAX_HASH_IDS = 16_384

# layout -> (time column(s), prompt column, output column)
_LAYOUTS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "azure": (("TIMESTAMP",), "ContextTokens", "GeneratedTokens"),
    "burstgpt": (("Timestamp",), "Request tokens", "Response tokens"),
    "plain": (("arrival_s", "timestamp"), "prompt_tokens", "output_tokens"),
    "mooncake": (("timestamp",), "input_length", "output_length"),
}
_HASH_IDS = "hash_ids"
_CLASS_COLUMN = "class"
_DATETIME_RE = re.compile(
    r"^\s*(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?\s*$"
)


def detect_layout(columns: list[str] | tuple[str, ...]) -> str | None:
    cols = set(columns)
    for name, (times, prompt, output) in _LAYOUTS.items():
        if any(t in cols for t in times) and prompt in cols and output in cols:
            return name
    return None


def _parse_datetime(text: str) -> tuple[int, float]:
    """(whole seconds since the epoch, fraction of a second) of a datetime string;
    naive times are read as UTC. The fraction keeps every digit given."""
    m = _DATETIME_RE.match(text)
    if m is None:
        raise ValueError(f"expected a datetime such as '2023-11-16 18:15:46.6805900', got {text!r}")
    whole = datetime.fromisoformat(m.group(1).replace("T", " "))
    tz = m.group(3)
    if tz is None or tz == "Z":
        whole = whole.replace(tzinfo=UTC)
    else:
        whole = datetime.fromisoformat(m.group(1).replace("T", " ") + tz)
    frac = float("0." + m.group(2)) if m.group(2) else 0.0
    return int(whole.timestamp()), frac


def _int_field(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        text = str(value).strip()
        try:
            number = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                raise ValueError(f"expected an integer, got {value!r}") from None
            if not f.is_integer():
                raise ValueError(f"expected an integer, got {value!r}") from None
            number = int(f)
    if number < 0:
        raise ValueError(f"must be >= 0, got {value!r}")
    return number


def _seconds_field(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected seconds (a number), got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected seconds (a number), got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"must be finite, got {value!r}")
    return number


def _hash_ids(value: Any) -> tuple[int, ...]:
    """A Mooncake row's ``hash_ids``: a list of non-negative integers."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of integers, got {value!r:.60}")
    if len(value) > MAX_HASH_IDS:
        raise ValueError(f"{len(value)} hash ids: more than {MAX_HASH_IDS}")
    for v in value:
        if type(v) is not int or v < 0:
            raise ValueError(f"expected non-negative integers, got {v!r:.30}")
    return tuple(value)


@dataclass(frozen=True, kw_only=True)
class ReplayTrace:
    """A trace file to replay as an open-loop phase (see the module docstring).

    Equality compares the options, not the rows read (they follow from the file)."""

    file: str
    format: str = "auto"
    time_scale: float = 1.0
    start_s: float = 0.0
    limit: int | None = None
    default_class: str | None = None
    model: str | None = None  # BurstGPT: keep only rows of this Model
    log_type: str | None = None  # BurstGPT: keep only rows of this Log Type
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS  # Mooncake: tokens per hash id

    # Read from the file; shape (n,) each. offsets_s: seconds from the first kept
    # arrival, already divided by time_scale, ascending.
    offsets_s: np.ndarray = field(init=False, compare=False, repr=False)
    prompt_tokens: np.ndarray = field(init=False, compare=False, repr=False)
    output_tokens: np.ndarray = field(init=False, compare=False, repr=False)
    classes: tuple[str | None, ...] = field(init=False, compare=False, repr=False)
    lines: tuple[int, ...] = field(init=False, compare=False, repr=False)  # file line of each
    #: Mooncake: each request's hash ids (empty tuples for other layouts)
    hash_ids: tuple[tuple[int, ...], ...] = field(init=False, compare=False, repr=False)
    layout: str = field(init=False, compare=False)
    num_skipped: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.file, Path):
            object.__setattr__(self, "file", str(self.file))
        if not isinstance(self.file, str) or not self.file:
            raise ProfileError(f"file: expected a path, got {self.file!r}")
        if self.format not in FORMATS:
            raise ProfileError(
                f"format: unknown trace format {self.format!r} "
                f"(expected one of {', '.join(FORMATS)})"
            )
        object.__setattr__(
            self, "time_scale", check_number("time_scale", self.time_scale, positive=True)
        )
        object.__setattr__(
            self, "start_s", check_number("start_s", self.start_s, non_negative=True)
        )
        if self.limit is not None:
            check_int("limit", self.limit, minimum=1)
        check_int("hash_block_tokens", self.hash_block_tokens, minimum=1)
        if self.default_class is not None:
            check_name("default_class", self.default_class)
        for key in ("model", "log_type"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise ProfileError(f"{key}: expected a string, got {value!r}")
        self._read()

    # -- derived -------------------------------------------------------------------

    @property
    def num_requests(self) -> int:
        return int(self.offsets_s.size)

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last kept arrival (after time_scale)."""
        return float(self.offsets_s[-1]) if self.offsets_s.size else 0.0

    @property
    def duration_s(self) -> float:
        """The phase length a trace gets when its phase sets no duration_s: its span
        plus one mean inter-arrival gap (1 s / time_scale for a one-request trace), so
        that the last arrival falls inside the phase."""
        n = self.num_requests
        gap = self.span_s / (n - 1) if n > 1 and self.span_s > 0 else 1.0 / self.time_scale
        return self.span_s + gap

    def hash_blocks(self, row: int, prompt_tokens: int) -> list[tuple[int, int]]:
        """Request ``row``'s shared blocks as (hash id, tokens): each id's block, the last
        one cut to the prompt's length; none past it (a prompt longer than its blocks
        ends in tokens of its own)."""
        size = self.hash_block_tokens
        blocks = []
        for i, h in enumerate(self.hash_ids[row]):
            n = min(size, prompt_tokens - i * size)
            if n <= 0:
                break
            blocks.append((h, n))
        return blocks

    def with_time_scale(self, factor: float) -> ReplayTrace:
        import dataclasses

        factor = check_number("time_scale", factor, positive=True)
        return dataclasses.replace(self, time_scale=self.time_scale * factor)

    # -- reading -------------------------------------------------------------------

    def _fail(self, line: int, column: str | None, message: str) -> ProfileError:
        where = f"line {line}" + (f", column {column!r}" if column is not None else "")
        return ProfileError(f"file: {self.file} {where}: {message}")

    def _rows(self, path: Path):
        """(line number, dict) for each data row, and the columns seen first."""
        try:
            handle = path.open(newline="", encoding="utf-8-sig")
        except OSError as e:
            raise ProfileError(f"file: cannot read {self.file!r}: {e.strerror or e}") from None
        with handle:
            if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
                for lineno, line in enumerate(handle, start=1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise self._fail(lineno, None, f"invalid JSON: {e.msg}") from None
                    if not isinstance(obj, dict):
                        raise self._fail(lineno, None, f"expected a JSON object, got {obj!r}")
                    yield lineno, obj
            else:
                reader = csv.DictReader(handle)
                if reader.fieldnames is None:
                    return
                for row in reader:
                    if None in row:
                        raise self._fail(reader.line_num, None, "more fields than the header")
                    if all(v is None or not str(v).strip() for v in row.values()):
                        continue
                    yield reader.line_num, row

    def _read(self) -> None:
        path = Path(self.file)
        times_whole: list[int] = []
        times_frac: list[float] = []
        prompts: list[int] = []
        outputs: list[int] = []
        classes: list[str | None] = []
        lines: list[int] = []
        hashes: list[tuple[int, ...]] = []
        skipped = 0
        layout: str | None = None if self.format == "auto" else self.format
        time_col = prompt_col = output_col = ""
        is_datetime = False
        resolved = False
        for lineno, row in self._rows(path):
            if not resolved:
                columns = list(row)
                if layout is None:
                    layout = detect_layout(columns)
                    if layout is None:
                        raise self._fail(
                            lineno,
                            None,
                            f"cannot tell the trace layout from its columns {columns} (expected "
                            "TIMESTAMP/ContextTokens/GeneratedTokens (azure), Timestamp/Request "
                            "tokens/Response tokens (burstgpt) or arrival_s/prompt_tokens/"
                            "output_tokens (plain))",
                        )
                times, prompt_col, output_col = _LAYOUTS[layout]
                found = [t for t in times if t in row]
                time_col = found[0] if found else times[0]
                is_datetime = layout == "azure"
                # Mooncake detection needs its hash ids: without, the row is plain-like
                if layout == "mooncake" and _HASH_IDS not in row:
                    raise self._fail(lineno, _HASH_IDS, "missing (mooncake layout)")
                resolved = True
            if self.model is not None and row.get("Model") != self.model:
                continue
            if self.log_type is not None and row.get("Log Type") != self.log_type:
                continue
            values = {}
            for col in (time_col, prompt_col, output_col):
                if col not in row or row[col] is None or str(row[col]).strip() == "":
                    raise self._fail(lineno, col, f"missing value ({layout} layout)")
            try:
                if is_datetime:
                    whole, frac = _parse_datetime(str(row[time_col]))
                else:
                    seconds = _seconds_field(row[time_col])
                    if layout == "mooncake":
                        seconds /= 1000.0  # milliseconds
                    whole, frac = math.floor(seconds), seconds - math.floor(seconds)
            except ValueError as e:
                raise self._fail(lineno, time_col, str(e)) from None
            for col in (prompt_col, output_col):
                try:
                    values[col] = _int_field(row[col])
                except ValueError as e:
                    raise self._fail(lineno, col, str(e)) from None
            name = row.get(_CLASS_COLUMN) if layout == "plain" else None
            if name is not None and str(name).strip() == "":
                name = None
            if name is not None:
                try:
                    check_name(_CLASS_COLUMN, name)
                except ProfileError as e:
                    raise self._fail(lineno, _CLASS_COLUMN, str(e).split(": ", 1)[1]) from None
            ids: tuple[int, ...] = ()
            if layout == "mooncake":
                try:
                    ids = _hash_ids(row.get(_HASH_IDS))
                except ValueError as e:
                    raise self._fail(lineno, _HASH_IDS, str(e)) from None
            if values[prompt_col] == 0 or values[output_col] == 0:
                skipped += 1
                continue
            hashes.append(ids)
            times_whole.append(whole)
            times_frac.append(frac)
            prompts.append(values[prompt_col])
            outputs.append(values[output_col])
            classes.append(name)
            lines.append(lineno)
        if not prompts:
            raise ProfileError(
                f"file: {self.file}: no requests in the trace"
                + (f" ({skipped} skipped with 0 tokens)" if skipped else "")
            )
        whole_a = np.asarray(times_whole, dtype=np.int64)
        frac_a = np.asarray(times_frac, dtype=np.float64)
        # Relative to the earliest arrival, whole seconds and fractions apart, so a
        # datetime's digits survive (epoch seconds as one float64 keep ~0.2 us).
        rel = (whole_a - whole_a.min()).astype(np.float64) + frac_a
        order = np.argsort(rel, kind="stable")
        rel = rel[order]
        keep = rel >= rel[0] + self.start_s
        idx = order[keep]
        rel = rel[keep]
        if self.limit is not None:
            idx, rel = idx[: self.limit], rel[: self.limit]
        if rel.size == 0:
            raise ProfileError(f"start_s: no arrivals in {self.file} after {self.start_s} s")
        _set = object.__setattr__
        _set(self, "offsets_s", (rel - rel[0]) / self.time_scale)
        _set(self, "prompt_tokens", np.asarray(prompts, dtype=np.int64)[idx])
        _set(self, "output_tokens", np.asarray(outputs, dtype=np.int64)[idx])
        _set(self, "classes", tuple(classes[i] for i in idx.tolist()))
        _set(self, "lines", tuple(lines[i] for i in idx.tolist()))
        _set(self, "hash_ids", tuple(hashes[i] for i in idx.tolist()))
        _set(self, "layout", layout)
        _set(self, "num_skipped", skipped)
