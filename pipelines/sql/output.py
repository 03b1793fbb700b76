"""Print or write query results: an aligned table, CSV, JSON lines or a Parquet file.

Why one module for every engine: the engines hand back Arrow batches, so a value prints the same
whichever engine computed it — timestamps as ISO 8601 in UTC (``2026-11-21T05:51:18.915Z``; a
timestamp without zone prints without ``Z``), binary (a message ``body``) as base64 in CSV and
JSON and as a short preview in a table, maps and structs as JSON objects, lists as JSON arrays,
decimals as plain numbers. CSV, JSON and Parquet write batch by batch and never hold a result; a
table has to measure its columns first, so it shows at most ``max_rows`` rows and says when it
stopped early.
"""

from __future__ import annotations

import base64
import csv
import json
import math
import os
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import IO, Any, Callable

import pyarrow as pa

from pipelines.sql.cli import DEFAULT_MAX_ROWS, FORMATS  # the CLI's choices are these sinks
from pipelines.sql.engines import Result, SqlError

CELL_WIDTH = 60              # table format: longer cells are cut with "…"
BYTES_PREVIEW = 32           # table format: bytes of a binary value shown


# ---- values ------------------------------------------------------------------------------------------
def iso_timestamp(value: datetime) -> str:
    """ISO 8601, UTC with ``Z`` for zoned values; milliseconds unless the value has microseconds."""
    suffix = ""
    if value.tzinfo is not None:
        value, suffix = value.astimezone(timezone.utc).replace(tzinfo=None), "Z"
    spec = "milliseconds" if value.microsecond % 1000 == 0 else "microseconds"
    return value.isoformat(timespec=spec) + suffix


def json_value(value: Any) -> Any:
    """A value as JSON data: bytes in base64, times in ISO, decimals and non-finite floats made
    representable, nested values converted throughout."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else
                                                    ("Infinity" if value > 0 else "-Infinity"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime):
        return iso_timestamp(value)
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {str(json_value(k)): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def _compact_json(value: Any) -> str:
    return json.dumps(json_value(value), ensure_ascii=False, separators=(",", ":"))


def text_value(value: Any) -> str:
    """A value as one CSV field: empty for NULL, nested values as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return _compact_json(value)
    converted = json_value(value)
    return converted if isinstance(converted, str) else str(converted)


def _printable(text: str) -> str:
    """Control characters (newline, ESC, …) would break a table row or drive the terminal."""
    return "".join(c if c.isprintable() else "." for c in text)


def bytes_preview(value: bytes) -> str:
    """A binary value in a table cell: its text when it is UTF-8 text, else hex; cut, with its size."""
    head = bytes(value[:BYTES_PREVIEW])
    text = None
    for cut in (0, 1, 2, 3) if len(value) > BYTES_PREVIEW else (0,):  # the cut may split a character
        try:
            text = head[:len(head) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    if text is None or any(not c.isprintable() and c not in "\t\n\r" for c in text):
        shown = "0x" + head.hex()
    else:
        shown = _printable(text)
    return shown + (f"… ({len(value)} B)" if len(value) > BYTES_PREVIEW else "")


def cell_value(value: Any, width: int = CELL_WIDTH) -> str:
    """A value in a table cell: NULL spelt out, bytes previewed, one line, at most ``width`` long."""
    if value is None:
        text = "NULL"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes_preview(bytes(value))
    else:
        text = _printable(text_value(value))
    return text if len(text) <= width else text[:width - 1] + "…"


def unique_names(names: list[str]) -> list[str]:
    """Column names made unique (``topic``, ``topic_2``): JSON objects and Parquet need it."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0) + 1
        seen[name] = count
        candidate = name if count == 1 else f"{name}_{count}"
        while candidate in seen and candidate != name:
            count += 1
            candidate = f"{name}_{count}"
        seen.setdefault(candidate, 1)
        out.append(candidate)
    return out


def _columns(batch: pa.RecordBatch) -> list[list]:
    return [column.to_pylist(maps_as_pydicts="lossy") for column in batch.columns]


def _plain_type(typ: pa.DataType) -> pa.DataType:
    """View types (DataFusion's strings and binaries) as the classic ones every Parquet reader knows."""
    if pa.types.is_string_view(typ):
        return pa.string()
    if pa.types.is_binary_view(typ):
        return pa.binary()
    if pa.types.is_list_view(typ) or pa.types.is_large_list_view(typ):
        return pa.list_(pa.field(typ.value_field.name, _plain_type(typ.value_type), typ.value_field.nullable))
    if pa.types.is_map(typ):
        return pa.map_(pa.field(typ.key_field.name, _plain_type(typ.key_type), False),
                       pa.field(typ.item_field.name, _plain_type(typ.item_type), typ.item_field.nullable),
                       keys_sorted=typ.keys_sorted)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        field = typ.value_field.with_type(_plain_type(typ.value_type))
        if pa.types.is_list(typ):
            return pa.list_(field)
        return pa.large_list(field) if pa.types.is_large_list(typ) else pa.list_(field, typ.list_size)
    if pa.types.is_struct(typ):
        return pa.struct([typ.field(i).with_type(_plain_type(typ.field(i).type)) for i in range(typ.num_fields)])
    return typ


def plain_schema(schema: pa.Schema) -> pa.Schema:
    names = unique_names(schema.names)
    return pa.schema([f.with_type(_plain_type(f.type)).with_name(n) for f, n in zip(schema, names)])


# ---- sinks -------------------------------------------------------------------------------------------
class Sink:
    """Where results go. ``write`` consumes one result and returns the rows written."""

    def write(self, result: Result) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def abort(self) -> None:
        """A statement failed half way: leave nothing misleading behind."""
        self.close()


class _TextSink(Sink):
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.results = 0

    def _separate(self) -> None:
        if self.results:
            self.out.write("\n")
        self.results += 1


class CsvSink(_TextSink):
    """RFC 4180 CSV with a header row; several results are separated by an empty line."""

    def write(self, result: Result) -> int:
        self._separate()
        writer = csv.writer(self.out, lineterminator="\n")
        writer.writerow(unique_names(result.schema.names))
        rows = 0
        for batch in result.batches:
            for row in zip(*_columns(batch)):
                writer.writerow([text_value(v) for v in row])
            rows += batch.num_rows
            self.out.flush()
        return rows


class JsonSink(_TextSink):
    """JSON lines: one object per row, keys in column order."""

    def write(self, result: Result) -> int:
        self.results += 1
        names = unique_names(result.schema.names)
        rows = 0
        for batch in result.batches:
            for row in zip(*_columns(batch)):
                self.out.write(json.dumps({n: json_value(v) for n, v in zip(names, row)}, ensure_ascii=False))
                self.out.write("\n")
            rows += batch.num_rows
            self.out.flush()
        return rows


class TableSink(_TextSink):
    """Aligned columns for people: at most ``max_rows`` rows, then a line saying more were left."""

    def __init__(self, out: IO[str], max_rows: int = DEFAULT_MAX_ROWS, cell_width: int = CELL_WIDTH) -> None:
        super().__init__(out)
        self.max_rows = max_rows
        self.cell_width = cell_width

    def write(self, result: Result) -> int:
        self._separate()
        rows: list[tuple] = []
        more = False
        for batch in result.batches:
            batch = batch.slice(0, self.max_rows + 1 - len(rows))  # convert only what is shown
            for row in zip(*_columns(batch)):
                if len(rows) == self.max_rows:
                    more = True
                    break
                rows.append(tuple(cell_value(v, self.cell_width) for v in row))
            if more:
                result.close()
                break
        names = [_printable(n) for n in result.schema.names]
        right = [_is_numeric(f.type) for f in result.schema]
        widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
        line = lambda cells: "  ".join(c.rjust(w) if r else c.ljust(w)  # noqa: E731
                                       for c, w, r in zip(cells, widths, right)).rstrip()
        self.out.write(line(names) + "\n")
        self.out.write("  ".join("-" * w for w in widths) + "\n")
        for r in rows:
            self.out.write(line(r) + "\n")
        if more:
            self.out.write(f"(first {len(rows)} rows shown, more not fetched: add a LIMIT, raise --max-rows, "
                           "or use --format csv|json|parquet for all of them)\n")
        else:
            self.out.write(f"({len(rows)} row{'' if len(rows) == 1 else 's'})\n")
        self.out.flush()
        return len(rows)


def _is_numeric(typ: pa.DataType) -> bool:
    return pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)


class ParquetSink(Sink):
    """One result into one Parquet file, batch by batch (a second result is refused)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer = None
        self.written = False

    def write(self, result: Result) -> int:
        import pyarrow.parquet as pq

        if self.written:
            raise SqlError("--format parquet writes one result per file: this is a second one "
                           "(run one query per file)")
        self.written = True
        schema = plain_schema(result.schema)
        self.writer = pq.ParquetWriter(self.path, schema)
        rows = 0
        for batch in result.batches:
            batch = pa.RecordBatch.from_arrays(batch.columns, names=schema.names)
            self.writer.write_batch(batch.cast(schema) if batch.schema != schema else batch)
            rows += batch.num_rows
        return rows

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def abort(self) -> None:
        self.close()
        if self.written and os.path.exists(self.path):
            os.remove(self.path)


def open_sink(fmt: str, out: IO[str] | None = None, path: str | None = None,
              max_rows: int = DEFAULT_MAX_ROWS) -> tuple[Sink, Callable[[], None]]:
    """The sink for ``fmt`` writing to ``path`` (a file) or ``out`` (stdout), and a function that
    closes what was opened here. Parquet needs a path."""
    if fmt == "parquet":
        if not path:
            raise ValueError("--format parquet needs --output FILE")
        sink = ParquetSink(path)
        return sink, sink.close
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    handle = open(path, "w", encoding="utf-8", newline="") if path else None
    stream = handle or out
    sink = {"csv": CsvSink, "json": JsonSink}.get(fmt)
    sink = sink(stream) if sink else TableSink(stream, max_rows)

    def close() -> None:
        sink.close()
        if handle:
            handle.close()
    return sink, close
