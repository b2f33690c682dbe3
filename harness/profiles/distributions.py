"""Token-length distributions: what a request class draws its prompt and output lengths from."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

import numpy as np

from harness.profiles.errors import ProfileError, check_int, check_number

# The parameters each kind takes (besides `min`/`max`). `empirical` takes exactly one
# of its two.
KIND_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("median", "sigma"),
    "exponential": ("mean",),
    "geometric": ("mean",),
    "empirical": ("values", "file"),
}
PARAM_FIELDS = ("value", "low", "high", "mean", "std", "median", "sigma", "values", "file")

# Upper clip when `max` is unset: keeps a heavy tail from overflowing the int64 cast.
_UNBOUNDED = 2**53


class Clip(TypedDict, total=False):
    """The clip bounds the constructors of :class:`LengthDistribution` pass through."""

    min: int
    max: int


@dataclass(frozen=True, kw_only=True)
class LengthDistribution:
    """A distribution of token counts, clipped to [min, max] and rounded to integers.

    Only the parameters of `kind` may be set (see `KIND_PARAMS`). `lognormal` is given
    by its median (= exp(mu)) and sigma of the underlying normal. `geometric` has
    support 1, 2, 3, ... and the given mean (>= 1). `empirical` resamples, uniformly
    with replacement, from `values` or from the integers in `file` (one per line).
    """

    kind: str
    value: float | None = None
    low: int | None = None
    high: int | None = None
    mean: float | None = None
    std: float | None = None
    median: float | None = None
    sigma: float | None = None
    values: tuple[int, ...] | None = None
    file: str | None = None
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KIND_PARAMS:
            raise ProfileError(
                f"kind: unknown distribution {self.kind!r} "
                f"(expected one of {', '.join(KIND_PARAMS)})"
            )
        own = KIND_PARAMS[self.kind]
        for key in PARAM_FIELDS:
            if key not in own and getattr(self, key) is not None:
                raise ProfileError(
                    f"{key}: not a parameter of a {self.kind} distribution "
                    f"(it takes {', '.join((*own, 'min', 'max'))})"
                )
        _VALIDATORS[self.kind](self)
        check_int("min", self.min, minimum=1)
        if self.max is not None:
            check_int("max", self.max, minimum=self.min)

    # -- constructors for Python-file profiles -------------------------------------

    @classmethod
    def fixed(cls, value: float, **clip: Unpack[Clip]) -> LengthDistribution:
        return cls(kind="fixed", value=value, **clip)

    @classmethod
    def uniform(cls, low: int, high: int, **clip: Unpack[Clip]) -> LengthDistribution:
        return cls(kind="uniform", low=low, high=high, **clip)

    @classmethod
    def normal(cls, mean: float, std: float, **clip: Unpack[Clip]) -> LengthDistribution:
        return cls(kind="normal", mean=mean, std=std, **clip)

    @classmethod
    def lognormal(cls, median: float, sigma: float, **clip: Unpack[Clip]) -> LengthDistribution:
        return cls(kind="lognormal", median=median, sigma=sigma, **clip)

    @classmethod
    def exponential(cls, mean: float, **clip: Unpack[Clip]) -> LengthDistribution:
        return cls(kind="exponential", mean=mean, **clip)

    @classmethod
    def geometric(cls, mean: float, **clip: Unpack[Clip]) -> LengthDistribution:
        return cls(kind="geometric", mean=mean, **clip)

    @classmethod
    def empirical(
        cls, values: Sequence[int] | None = None, *, file: str | Path | None = None, **clip: int
    ) -> LengthDistribution:
        return cls(
            kind="empirical",
            values=None if values is None else tuple(values),
            file=None if file is None else str(file),
            **clip,
        )

    # -- sampling ------------------------------------------------------------------

    @property
    def upper(self) -> int | None:
        """The largest value `sample` can return, or None when unbounded."""
        if self.max is not None:
            return self.max
        if self.kind == "fixed":
            return max(self.min, round(self.value))  # type: ignore[arg-type]
        if self.kind == "uniform":
            return max(self.min, self.high)  # type: ignore[type-var]
        if self.kind == "empirical":
            return max(self.min, *self.values)  # type: ignore[misc]
        return None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw `n` lengths: int64 array of shape (n,), every value in [min, max]."""
        raw = _SAMPLERS[self.kind](self, rng, n)
        upper = _UNBOUNDED if self.max is None else self.max
        return np.clip(np.rint(raw), self.min, upper).astype(np.int64)

    def describe(self) -> str:
        params = ", ".join(
            f"{k}={getattr(self, k)!r}"
            for k in KIND_PARAMS[self.kind]
            if getattr(self, k) is not None and k != "values"
        )
        if self.values is not None and self.file is None:
            params = f"{len(self.values)} values"
        clip = f"[{self.min}, {'inf' if self.max is None else self.max}]"
        return f"{self.kind}({params}) clipped to {clip}"


# -- per-kind validation -----------------------------------------------------------


def _set(dist: LengthDistribution, key: str, value: Any) -> None:
    # Normalising a frozen instance's field in __post_init__.
    object.__setattr__(dist, key, value)


def _require(dist: LengthDistribution, key: str) -> Any:
    value = getattr(dist, key)
    if value is None:
        raise ProfileError(f"{key}: required for a {dist.kind} distribution")
    return value


def _validate_fixed(d: LengthDistribution) -> None:
    check_number("value", _require(d, "value"), positive=True)


def _validate_uniform(d: LengthDistribution) -> None:
    low = check_int("low", _require(d, "low"), minimum=1)
    check_int("high", _require(d, "high"), minimum=low)


def _validate_normal(d: LengthDistribution) -> None:
    check_number("mean", _require(d, "mean"), positive=True)
    check_number("std", _require(d, "std"), non_negative=True)


def _validate_lognormal(d: LengthDistribution) -> None:
    check_number("median", _require(d, "median"), positive=True)
    check_number("sigma", _require(d, "sigma"), non_negative=True)


def _validate_exponential(d: LengthDistribution) -> None:
    check_number("mean", _require(d, "mean"), positive=True)


def _validate_geometric(d: LengthDistribution) -> None:
    mean = check_number("mean", _require(d, "mean"))
    if mean < 1:
        raise ProfileError(
            f"mean: a geometric distribution (support 1, 2, ...) needs mean >= 1, got {d.mean!r}"
        )


def _validate_empirical(d: LengthDistribution) -> None:
    if (d.values is None) == (d.file is None):
        raise ProfileError(
            "values: an empirical distribution takes exactly one of `values` or `file`"
        )
    key = "values"
    values: Any = d.values
    if d.file is not None:
        key = "file"
        values = read_lengths_file(Path(d.file))
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ProfileError(f"{key}: expected a list of integers, got {values!r}")
    if not values:
        raise ProfileError(f"{key}: no values")
    for i, v in enumerate(values):
        check_int(f"{key}[{i}]", v, minimum=1)
    _set(d, "values", tuple(values))


def read_lengths_file(path: Path) -> list[int]:
    """Integers one per line; blank lines and `#` comments are skipped. For CSV files
    the first column is read and a non-numeric first line is taken as the header."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ProfileError(f"file: cannot read {str(path)!r}: {e.strerror or e}") from None
    values: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        field = line.split("#", 1)[0].split(",", 1)[0].strip()
        if not field:
            continue
        try:
            values.append(int(field))
        except ValueError:
            if lineno == 1:
                continue  # a CSV header
            raise ProfileError(
                f"file: {str(path)!r} line {lineno}: expected an integer, got {field!r}"
            ) from None
    return values


_VALIDATORS: dict[str, Callable[[LengthDistribution], None]] = {
    "fixed": _validate_fixed,
    "uniform": _validate_uniform,
    "normal": _validate_normal,
    "lognormal": _validate_lognormal,
    "exponential": _validate_exponential,
    "geometric": _validate_geometric,
    "empirical": _validate_empirical,
}

# Each sampler returns raw (unrounded, unclipped) draws of shape (n,).
_SAMPLERS: dict[str, Callable[[LengthDistribution, np.random.Generator, int], np.ndarray]] = {
    "fixed": lambda d, rng, n: np.full(n, float(d.value)),  # type: ignore[arg-type]
    "uniform": lambda d, rng, n: rng.integers(d.low, d.high, size=n, endpoint=True),  # type: ignore[arg-type]
    "normal": lambda d, rng, n: rng.normal(d.mean, d.std, size=n),  # type: ignore[arg-type]
    "lognormal": lambda d, rng, n: rng.lognormal(math.log(d.median), d.sigma, size=n),  # type: ignore[arg-type]
    "exponential": lambda d, rng, n: rng.exponential(d.mean, size=n),  # type: ignore[arg-type]
    "geometric": lambda d, rng, n: rng.geometric(1.0 / d.mean, size=n),  # type: ignore[operator]
    "empirical": lambda d, rng, n: rng.choice(np.asarray(d.values, dtype=np.int64), size=n),
}


# -- durations ------------------------------------------------------------------------

#: The parameters of each kind of :class:`SecondsDistribution` (besides `min`/`max`).
SECONDS_KIND_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "exponential": ("mean",),
    "lognormal": ("median", "sigma"),
}


@dataclass(frozen=True, kw_only=True)
class SecondsDistribution:
    """A distribution of durations in seconds (a session's think times), clipped to
    [min, max]; not rounded. Zero is allowed (an agent sends its next turn at once):
    ``fixed`` with ``value = 0``, or ``min = 0`` (the default)."""

    kind: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    median: float | None = None
    sigma: float | None = None
    min: float = 0.0
    max: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SECONDS_KIND_PARAMS:
            raise ProfileError(
                f"kind: unknown distribution {self.kind!r} "
                f"(expected one of {', '.join(SECONDS_KIND_PARAMS)})"
            )
        own = SECONDS_KIND_PARAMS[self.kind]
        for key in ("value", "low", "high", "mean", "median", "sigma"):
            value = getattr(self, key)
            if key not in own:
                if value is not None:
                    raise ProfileError(
                        f"{key}: not a parameter of a {self.kind} duration distribution "
                        f"(it takes {', '.join((*own, 'min', 'max'))})"
                    )
                continue
            if value is None:
                raise ProfileError(f"{key}: required for a {self.kind} distribution")
            positive = key in ("mean", "median")
            _set_any(self, key, check_number(key, value, positive=positive, non_negative=True))
        if self.kind == "uniform" and self.high < self.low:  # type: ignore[operator]
            raise ProfileError(f"high: must be >= low ({self.low}), got {self.high!r}")
        _set_any(self, "min", check_number("min", self.min, non_negative=True))
        if self.max is not None:
            _set_any(self, "max", check_number("max", self.max, non_negative=True))
            if self.max < self.min:
                raise ProfileError(f"max: must be >= min ({self.min}), got {self.max!r}")

    @classmethod
    def fixed(cls, value: float) -> SecondsDistribution:
        return cls(kind="fixed", value=value)

    @classmethod
    def exponential(cls, mean: float, **clip: float) -> SecondsDistribution:
        return cls(kind="exponential", mean=mean, **clip)

    @classmethod
    def lognormal(cls, median: float, sigma: float, **clip: float) -> SecondsDistribution:
        return cls(kind="lognormal", median=median, sigma=sigma, **clip)

    @classmethod
    def uniform(cls, low: float, high: float) -> SecondsDistribution:
        return cls(kind="uniform", low=low, high=high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` durations: float64 array of shape (n,), every value in [min, max]."""
        if self.kind == "fixed":
            raw = np.full(n, float(self.value))  # type: ignore[arg-type]
        elif self.kind == "uniform":
            raw = rng.uniform(self.low, self.high, size=n)  # type: ignore[arg-type]
        elif self.kind == "exponential":
            raw = rng.exponential(self.mean, size=n)  # type: ignore[arg-type]
        else:
            raw = rng.lognormal(math.log(self.median), self.sigma, size=n)  # type: ignore[arg-type]
        return np.clip(raw, self.min, np.inf if self.max is None else self.max)

    @property
    def mean_s(self) -> float:
        """The mean before clipping (for descriptions and expected durations)."""
        if self.kind == "fixed":
            return float(self.value)  # type: ignore[arg-type]
        if self.kind == "uniform":
            return (self.low + self.high) / 2  # type: ignore[operator]
        if self.kind == "exponential":
            return float(self.mean)  # type: ignore[arg-type]
        return self.median * math.exp(self.sigma**2 / 2)  # type: ignore[operator]

    def describe(self) -> str:
        params = ", ".join(f"{k}={getattr(self, k)!r}" for k in SECONDS_KIND_PARAMS[self.kind])
        clip = f"[{self.min}, {'inf' if self.max is None else self.max}] s"
        return f"{self.kind}({params}) clipped to {clip}"


def _set_any(obj: Any, key: str, value: Any) -> None:
    object.__setattr__(obj, key, value)
