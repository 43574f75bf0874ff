"""Render report rows as a table (rich on a terminal, plain when piped), CSV or JSON.

Rows are dicts with snake_case keys; every format shows the same columns in the same order.
Durations are seconds in the data (CSV, JSON: a `seconds` word in the column name says so); a
table shows them as hours: `queue_wait_p50_seconds` is `queue_wait_p50_hours` there, divided by
3600 (`in_hours`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TextIO

FORMATS = ("table", "csv", "json")


def render(
    rows: Sequence[Mapping[str, Any]],
    out: TextIO,
    fmt: str = "table",
    *,
    columns: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    cols = list(columns) if columns is not None else _columns(rows)
    if fmt == "json":
        out.write(json.dumps([{c: _json_value(r.get(c)) for c in cols} for r in rows], indent=2))
        out.write("\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(cols)
        for r in rows:
            writer.writerow([_text(r.get(c)) for c in cols])
    elif fmt == "table":
        rows, cols = in_hours(rows, cols)
        if out.isatty():
            _rich_table(rows, cols, out, title)
        else:
            _plain_table(rows, cols, out, title)
    else:
        raise ValueError(f"unknown format '{fmt}' (use {', '.join(FORMATS)})")


def hours_name(column: str) -> str | None:
    """The table name of a duration column in seconds (`gpu_seconds_completed` ->
    `gpu_hours_completed`), None for other columns. A bare `seconds` (a short run's duration)
    stays in seconds."""
    words = column.split("_")
    if "seconds" not in words or len(words) < 2:
        return None
    return "_".join("hours" if w == "seconds" else w for w in words)


def in_hours(
    rows: Sequence[Mapping[str, Any]], cols: Sequence[str]
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(rows, columns) with every duration column in seconds shown as hours, the one rule of
    tables; a seconds column whose hours twin is also shown is left out."""
    renamed = {c: h for c in cols if (h := hours_name(c)) is not None}
    if not renamed:
        return list(rows), list(cols)
    shown = [renamed.get(c, c) for c in cols if renamed.get(c) not in cols]
    converted: list[Mapping[str, Any]] = []
    for r in rows:
        row = dict(r)
        for c, h in renamed.items():
            if h not in cols:
                row[h] = _hours(r.get(c))
        converted.append(row)
    return converted, shown


def _hours(seconds: Any) -> Any:
    if not _is_number(seconds):
        return seconds
    return round(float(seconds) / 3600, 4)


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    return cols


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        # money stays exact: a string, not a binary float
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if not value.is_integer() else str(int(value))
    if isinstance(value, tuple | list):
        return ",".join(_text(v) for v in value)
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _plain_table(rows: Sequence[Mapping[str, Any]], cols: list[str], out: TextIO, title: str | None) -> None:
    if title:
        out.write(f"{title}\n")
    cells = [[_text(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    numeric = [any(_is_number(r.get(c)) for r in rows) for c in cols]
    out.write("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(row, widths, numeric, strict=True)]
        out.write("  ".join(parts).rstrip() + "\n")
    if not rows:
        out.write("(no rows)\n")


def _rich_table(rows: Sequence[Mapping[str, Any]], cols: list[str], out: TextIO, title: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in cols:
        table.add_column(c, justify="right" if any(_is_number(r.get(c)) for r in rows) else "left")
    for r in rows:
        table.add_row(*[_text(r.get(c)) for c in cols])
    Console(file=out).print(table)
