"""Types for annotating Polars schemas and reading numeric aggregates.

A schema's column type is either a data type class (``pl.Int64``) or an instance
(``pl.List(pl.String)``); Polars accepts both, and :data:`PolarsType` names the two.

Polars types a ``Series`` aggregate (``.mean()``, ``.max()``, ``.min()``, ...) as any
Python value a column of any type could hold; :func:`as_float` and :func:`as_int` read
the one of a numeric column, raising ``TypeError`` (as ``float(None)`` would) on anything
else, such as the None of an empty or all-null column.
"""

from __future__ import annotations

from typing import TypeAlias

from polars.datatypes import DataType, DataTypeClass

#: A column's type in a schema: a class (``pl.Int64``) or an instance (``pl.List(...)``).
PolarsType: TypeAlias = DataType | DataTypeClass

#: Column names to their types, in order.
Schema: TypeAlias = dict[str, PolarsType]


def as_float(value: object) -> float:
    """A numeric aggregate as a float (``TypeError`` for anything but a number)."""
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


def as_int(value: object) -> int:
    """An integer aggregate as an int (``TypeError`` for anything but a number)."""
    if isinstance(value, (int, float)):
        return int(value)
    raise TypeError(f"not a number: {value!r}")
