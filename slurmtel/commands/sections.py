"""Several report sections in one output (admin reports, fabric reports): titled tables, a JSON
object of lists, or CSV blocks under "# name"."""

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
