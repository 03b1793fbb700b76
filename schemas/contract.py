"""A table's whole contract in one value: name, columns with their meaning, partitioning, row key,
required and allowed values.

Jobs and writers take the Arrow schema and partitioning from here, the quality suites take the key,
the non-null rules and the allowed values, the SQL shell and the Spark schemas take the
descriptions: one definition per table (the tables themselves are declared in
:mod:`schemas.messages`, :mod:`schemas.tables`, :mod:`schemas.reports` and :mod:`schemas.replay`
and collected in :mod:`schemas.registry`).

Descriptions travel with the data: every field of :attr:`TableContract.schema` carries its
description as Arrow field metadata under :data:`DESCRIPTION_KEY` (``comment``). delta-rs copies
Arrow field metadata into the Delta schema when it creates a table, and ``comment`` is the key
Delta Lake and Spark read as a column's comment (``DESCRIBE TABLE``, catalogs), so a lake created
from these schemas documents itself. delta-rs ignores field metadata when it checks an append or
an overwrite against the table's schema, so tables created before the descriptions existed (or by
a writer whose schema has none) keep accepting rows either way, and keep the schema they had.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, NamedTuple

import pyarrow as pa

# Arrow field metadata key of a column's description; what Delta/Spark call a column comment
DESCRIPTION_KEY = "comment"
ENUM_SEPARATOR = " | "


class Column(NamedTuple):
    """One column: unpacks as the ``(name, type, description)`` triple the modules always used."""

    name: str
    type: pa.DataType
    description: str


Columns = list[tuple[str, pa.DataType, str]]


def one_of(values: Iterable[Any]) -> str:
    """``"A | B | C"``: an enumerated column's description written from the same constants the
    contract's :class:`Allowed` holds, so the text cannot drift from what is enforced."""
    return ENUM_SEPARATOR.join(str(v) for v in values)


def described_field(name: str, typ: pa.DataType, description: str) -> pa.Field:
    """An Arrow field carrying its description as metadata (see :data:`DESCRIPTION_KEY`)."""
    return pa.field(name, typ, metadata={DESCRIPTION_KEY: description})


def schema_of(columns: Iterable[tuple[str, pa.DataType, str]]) -> pa.Schema:
    """The Arrow schema of ``columns``, each field with its description as metadata."""
    return pa.schema([described_field(name, typ, text) for name, typ, text in columns])


def description_of(f: pa.Field) -> str | None:
    """The description an Arrow field carries (None when it has none, e.g. read from an old table)."""
    raw = (f.metadata or {}).get(DESCRIPTION_KEY.encode())
    return raw.decode("utf-8") if raw is not None else None


@dataclass(frozen=True)
class Allowed:
    """The values ``column`` may take (nulls aside), on every row or only where ``when`` =
    ``(other column, value)`` holds (e.g. lag statuses per row level)."""

    column: str
    values: tuple[Any, ...]
    when: tuple[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise ValueError(f"allowed values of {self.column!r}: empty")


@dataclass(frozen=True)
class TableContract:
    """Everything a writer, a reader and a quality suite need to agree on about one Delta table.

    ``key``: the columns that identify a row (unique per table; empty when rows legitimately repeat,
    e.g. appended evaluations). ``required``: columns no row may leave null, beyond what the key
    implies (checked by the quality suite: each costs a scan, so the list names the ones a reader
    relies on). ``allowed``: enumerated columns and their values.
    """

    name: str
    description: str
    columns: tuple[Column, ...]
    partition_by: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    allowed: tuple[Allowed, ...] = field(default=())

    def __post_init__(self) -> None:
        for attr in ("columns", "partition_by", "key", "required", "allowed"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        object.__setattr__(self, "columns", tuple(Column(*c) for c in self.columns))
        names = [c.name for c in self.columns]
        problems = [f"duplicate column {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
        problems += [f"column {c.name!r} has no description" for c in self.columns if not c.description.strip()]
        if not self.description.strip():
            problems.append("no table description")
        referenced = [("partition column", self.partition_by), ("key column", self.key),
                      ("required column", self.required),
                      ("allowed-values column", [a.column for a in self.allowed]),
                      ("allowed-values condition", [a.when[0] for a in self.allowed if a.when])]
        problems += [f"{what} {n!r} is not a column" for what, cols in referenced for n in cols if n not in names]
        if problems:
            raise ValueError(f"table contract {self.name!r}: " + "; ".join(problems))

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @cached_property
    def schema(self) -> pa.Schema:
        """The Arrow schema writers use; every field carries its description (``comment``)."""
        return schema_of(self.columns)

    @property
    def descriptions(self) -> dict[str, str]:
        return {c.name: c.description for c in self.columns}

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    def allowed_values(self, column: str) -> tuple[Any, ...]:
        """Every value ``column`` may take on some row (the union over its conditions, in order);
        empty when the column is not enumerated."""
        values: list[Any] = []
        for a in self.allowed:
            if a.column == column:
                values.extend(v for v in a.values if v not in values)
        return tuple(values)
