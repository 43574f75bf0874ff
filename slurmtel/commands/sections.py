"""A report document as a table, CSV or JSON (write_report: the one writer of every report, spec
or view, on the head or from the API), and several sections in one output: titled tables, a
JSON object of lists, or CSV blocks under "# name"."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, TextIO

from slurmtel.reports.render import render


def render_sections(
    sections: Mapping[str, Sequence[Mapping[str, Any]]],
    out: TextIO,
    fmt: str,
    columns: Mapping[str, Sequence[str]],
    titles: Mapping[str, str],
    first: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Several sections: titled tables (FIRST: the columns each keeps first when narrow); a JSON
    object of lists; CSV blocks under "# name"."""
    if fmt == "json":
        document = {}
        for name, rows in sections.items():
            buffer = io.StringIO()
            render(json_numbers(rows), buffer, "json", columns=columns[name])
            document[name] = json.loads(buffer.getvalue())
        out.write(json.dumps(document, indent=2))
        out.write("\n")
        return
    for i, (name, rows) in enumerate(sections.items()):
        if i:
            out.write("\n")
        if fmt == "csv":
            out.write(f"# {name}\n")
            render(rows, out, "csv", columns=columns[name])
        else:
            render(
                rows,
                out,
                fmt,
                columns=columns[name],
                title=titles.get(name, name),
                first=(first or {}).get(name, ()),
            )


def json_numbers(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Exact Decimals (GPU time, shares) go to JSON as numbers (their decimal text is kept:
    12.3456 stays 12.3456); money stays an exact string (slurmtel.columns: Kind.MONEY), in every
    report alike."""
    from slurmtel.columns import COLUMNS, Kind

    def value(name: str, v: Any) -> Any:
        col = COLUMNS.get(name)
        if isinstance(v, Decimal) and (col is None or col.kind is not Kind.MONEY):
            return float(v)
        return v

    return [{k: value(k, v) for k, v in r.items()} for r in rows]


def write_report(document: Mapping[str, Any], out: TextIO, fmt: str) -> None:
    """A report document (reports.spec.report_document, a view's of slurmtel.commands.views,
    or the API's) as a table (each section's table columns; a transposed one-row document as
    figure/value lines), CSV or JSON (every column)."""
    sections = {s["name"]: s["rows"] for s in document["sections"]}
    titles = {s["name"]: s["title"] for s in document["sections"]}
    key = "table_columns" if fmt == "table" else "columns"
    columns = {s["name"]: s[key] for s in document["sections"]}
    first = {s["name"]: s.get("key_columns", ()) for s in document["sections"]}
    if document["single"]:
        (name,) = sections
        rows = sections[name]
        if document.get("transpose") and fmt == "table" and len(rows) == 1:
            # one row of many figures: a figure a line (every column, the row's kind aside)
            (row,) = rows
            every = next(s["columns"] for s in document["sections"] if s["name"] == name)
            figures = [{"figure": c, "value": row.get(c)} for c in every if c != "kind"]
            render(figures, out, "table", columns=("figure", "value"), title=titles[name])
            return
        render(
            json_numbers(rows) if fmt == "json" else rows,
            out,
            fmt,
            columns=columns[name],
            title=titles[name],
            first=first[name],
        )
        return
    render_sections(sections, out, fmt, columns, titles, first)
