"""Render report rows as a table (rich on a terminal, plain when piped), CSV or JSON.

Rows are dicts keyed by registered columns (slurmtel.columns); every format shows the same
columns in the same order. CSV and JSON give each value in its column's unit (seconds, bytes,
joules, fractions); a table converts them, here and nowhere else (`for_table`): seconds to hours,
bytes to GiB, joules to kWh, shares to percent, each renamed (`queue_wait_p50_seconds` is
`queue_wait_p50_hours` there, `idle_share` is `idle_percent`).

Tables are for people (docs/commands.md "Tables on a terminal"):

* every cell and title is shown literally: nothing in it is read as rich markup, and a control
  character (C0, DEL, C1: what can move the cursor, retitle or clear a terminal) is shown as
  `\\xNN` (`\\x1b` for ESC). CSV and JSON keep the data as it is (JSON escapes control
  characters itself; a CSV cell may hold them: it is data for a program, not for a terminal);
* a figure (a number, or a text that is one such as money from a closed statement) is never
  wrapped, cut or elided;
* on a terminal too narrow for every column, whole columns are left out, lowest priority first,
  and a line under the table names them (`--wide` or `--format csv` shows them all). Priority:
  the columns the output names first (`first`: a report spec's key columns, the row's key and
  the figures that answer its question), then the identity columns (the text columns before
  the first figure, and cluster, account, user, partition, job_id, name, node, gpu, day, month,
  figure wherever they stand), then the figures in their order, then the other text columns
  (states, reasons, lists, times); a column empty in every row goes last. Text columns may
  wrap;
* a GPU is named `node/index` (the `gpu` column); its `gpu_uuid` column is shown in tables only
  with `--wide` (CSV and JSON always have it).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from datetime import date, datetime, tzinfo
from decimal import Decimal
from typing import Any, TextIO

from slurmtel.columns import table_name, table_value

FORMATS = ("table", "csv", "json")

# --wide for this command (set once by slurmtel.cli.main): every column, full GPU UUIDs
WIDE: ContextVar[bool] = ContextVar("slurmtel_table_wide", default=False)
# the site's zone (site.timezone, set once by slurmtel.cli.main): a table shows instants in it
ZONE: ContextVar[tzinfo | None] = ContextVar("slurmtel_table_zone", default=None)

# a terminal whose width nothing tells
DEFAULT_WIDTH = 80
# rich's default box: one space of padding each side of a cell and a rule between columns, plus
# the rules at both edges
_CELL_OVERHEAD = 3
_EDGE_OVERHEAD = 1
# a text column is not squeezed below this (its text wraps in it)
_TEXT_MIN_WIDTH = 10

# what a row is about: kept first when a table must leave columns out (with the text columns
# before its first figure)
IDENTITY_COLUMNS = frozenset(
    {"cluster", "account", "user", "partition", "job_id", "name", "node", "gpu", "day", "month", "figure"}
)

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_FIGURE = re.compile(r"[-+]?\d[\d,_]*(\.\d+)?([eE][-+]?\d+)?%?")


def render(
    rows: Sequence[Mapping[str, Any]],
    out: TextIO,
    fmt: str = "table",
    *,
    columns: Sequence[str] | None = None,
    title: str | None = None,
    wide: bool | None = None,
    first: Sequence[str] = (),
) -> None:
    """ROWS as FMT. FIRST: the columns a table too narrow for all keeps first, in order (the
    row's key and the figures that answer the question), before the ranking of fit_columns."""
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
        wide = WIDE.get() if wide is None else wide
        rows, cols = for_table(rows, cols)
        if not wide and "gpu" in cols:
            cols = [c for c in cols if c != "gpu_uuid"]
        if out.isatty():
            _rich_table(rows, cols, out, title, wide=wide, first=[table_name(c) for c in first])
        else:
            _plain_table(rows, cols, out, title)
    else:
        raise ValueError(f"unknown format '{fmt}' (use {', '.join(FORMATS)})")


def window_text(start: datetime, end: datetime, zone: tzinfo) -> str:
    """The one way a window is printed, in every title: its half-open ends in the site's zone,
    to the minute, and the zone (`2026-11-29 00:00 – 2026-12-06 00:00 Europe/Berlin`). A
    report of whole site days prints the days' edges: the same window prints the same."""

    def local(moment: datetime) -> str:
        return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M")

    return f"{local(start)} – {local(end)} {getattr(zone, 'key', None) or str(zone)}"


def local_time(moment: datetime, zone: tzinfo) -> str:
    """An instant as a table shows it: to the second in the site's zone, with the zone's
    abbreviation (`2026-11-01 11:00:00 CET`)."""
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def months_text(months: Decimal) -> str:
    """Calendar months as a title shows them: at most 3 decimals, no trailing zeros."""
    rounded = months.quantize(Decimal("0.001")).normalize()
    return f"{rounded:f} month{'' if rounded == 1 else 's'}"


def escape_controls(text: str) -> str:
    """TEXT with every control character (C0, DEL, C1) as `\\xNN`: safe to print on a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def gpu_name(node: str, index: int | None, uuid: str) -> str:
    """A GPU as a table shows it: `node/index` as nvidia-smi numbers it, the UUID where the
    index is not known."""
    return f"{node}/{index}" if index is not None and node else uuid


def for_table(
    rows: Sequence[Mapping[str, Any]], cols: Sequence[str]
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """(rows, columns) in the table units of slurmtel.columns (`table_name`, `table_value`): the
    one place a table converts; a `figure` column naming a registered column converts its
    `value` (figure/value tables); instants in the site's zone (ZONE) where it is set."""
    shown = [table_name(c) for c in cols]
    figure_value = "figure" in cols and "value" in cols
    zone = ZONE.get()
    converted: list[Mapping[str, Any]] = []
    for r in rows:
        row = {table_name(c): table_value(c, r.get(c)) for c in cols}
        if zone is not None:
            row.update({c: local_time(v, zone) for c, v in row.items() if isinstance(v, datetime)})
        if figure_value and isinstance(r.get("figure"), str):
            row["figure"] = table_name(r["figure"])
            row["value"] = table_value(r["figure"], r.get("value"))
        converted.append(row)
    return converted, shown


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


def _cell(value: Any) -> str:
    """A table cell: the value's text with control characters escaped."""
    return escape_controls(_text(value))


def _plain_table(rows: Sequence[Mapping[str, Any]], cols: list[str], out: TextIO, title: str | None) -> None:
    if title:
        out.write(f"{escape_controls(title)}\n")
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    numeric = [any(_is_number(r.get(c)) for r in rows) for c in cols]
    out.write("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(row, widths, numeric, strict=True)]
        out.write("  ".join(parts).rstrip() + "\n")
    if not rows:
        out.write("(no rows)\n")


def terminal_width(out: TextIO) -> int:
    """Columns of the terminal OUT writes to: $COLUMNS, else the terminal's own size, else 80."""
    with contextlib.suppress(ValueError):
        columns = int(os.environ.get("COLUMNS", ""))
        if columns > 0:
            return columns
    with contextlib.suppress(ValueError, OSError, AttributeError):
        columns = os.get_terminal_size(out.fileno()).columns
        if columns > 0:
            return columns
    return DEFAULT_WIDTH


def _is_figure_column(values: Sequence[Any]) -> bool:
    present = [v for v in values if v is not None and v != ""]
    return bool(present) and all(
        _is_number(v) or (isinstance(v, str) and _FIGURE.fullmatch(v) is not None) for v in present
    )


def _header_parts(name: str) -> list[str]:
    """A header's pieces where it may wrap: after each underscore."""
    parts = [p + "_" for p in name.split("_")]
    parts[-1] = parts[-1][:-1]
    return [p for p in parts if p]


def _wrap_header(name: str, width: int) -> str:
    lines: list[str] = []
    for part in _header_parts(name):
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(lines)


def fit_columns(
    cols: Sequence[str],
    cells: Sequence[Sequence[str]],
    figures: Sequence[bool],
    width: int,
    first: Sequence[str] = (),
) -> tuple[list[int], list[int]]:
    """(indexes of the columns shown, their widths) for a table WIDTH columns wide: a figure
    column is as wide as its widest value, a text column at least _TEXT_MIN_WIDTH (or its widest
    value); columns are left out whole, lowest priority first: FIRST in its order, then the
    module docstring's ranking."""
    from rich.cells import cell_len

    n = len(cols)
    natural: list[int] = []
    least: list[int] = []
    for i, c in enumerate(cols):
        longest = max([cell_len(row[i]) for row in cells] or [0])
        header_min = max(cell_len(p) for p in _header_parts(c)) if c else 0
        natural.append(max(longest, cell_len(c)))
        if figures[i]:
            least.append(max(longest, header_min))
        else:
            least.append(min(natural[-1], max(header_min, _TEXT_MIN_WIDTH)))
    first_figure = next((i for i in range(n) if figures[i]), n)
    keys = [cols.index(c) for c in first if c in cols]
    identity = [i for i in range(n) if (i < first_figure or cols[i] in IDENTITY_COLUMNS) and i not in keys]
    ranked = keys + identity + [i for i in range(n) if figures[i] and i not in identity and i not in keys]
    ranked += [i for i in range(n) if i not in ranked]
    # a column with no value in any row says nothing: it goes last, whatever its rank
    ranked = [i for i in ranked if any(row[i] for row in cells)] + [
        i for i in ranked if not any(row[i] for row in cells)
    ]
    budget = width - _EDGE_OVERHEAD
    chosen: list[int] = []
    used = 0
    for i in ranked:
        need = least[i] + _CELL_OVERHEAD
        if used + need <= budget or not chosen:
            chosen.append(i)
            used += need
    chosen.sort()
    widths = {i: least[i] for i in chosen}
    spare = budget - used
    # the room left goes to the columns that would wrap, one cell at a time, left to right
    while spare > 0:
        grew = False
        for i in chosen:
            if spare > 0 and widths[i] < natural[i]:
                widths[i] += 1
                spare -= 1
                grew = True
        if not grew:
            break
    return chosen, [widths[i] for i in chosen]


def _rich_table(
    rows: Sequence[Mapping[str, Any]],
    cols: list[str],
    out: TextIO,
    title: str | None,
    *,
    wide: bool = False,
    first: Sequence[str] = (),
) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    figures = [_is_figure_column([r.get(c) for r in rows]) for c in cols]
    numeric = [any(_is_number(r.get(c)) for r in rows) for c in cols]
    width = terminal_width(out)
    if wide:
        # every column at its full width; the terminal folds lines wider than itself
        chosen, widths = fit_columns(cols, cells, figures, 10**6)
        widths = [max(w, len(cols[i])) for i, w in zip(chosen, widths, strict=True)]
        width = sum(widths) + _CELL_OVERHEAD * len(widths) + _EDGE_OVERHEAD
    else:
        chosen, widths = fit_columns(cols, cells, figures, width, first)
    table = Table(title=Text(escape_controls(title)) if title else None)
    for i, w in zip(chosen, widths, strict=True):
        table.add_column(
            Text(_wrap_header(cols[i], w)),
            justify="right" if numeric[i] else "left",
            width=w,
            no_wrap=figures[i],
            overflow="fold",
        )
    for row in cells:
        table.add_row(*[Text(row[i]) for i in chosen])
    console = Console(file=out, width=width, force_terminal=True, highlight=False, emoji=False, markup=False)
    console.print(table)
    left_out = [c for i, c in enumerate(cols) if i not in chosen]
    if left_out:
        console.print(
            Text(
                f"not shown ({width} columns): {', '.join(left_out)}; --wide or --format csv shows every column"
            )
        )
