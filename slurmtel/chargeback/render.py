"""The exact bytes of a statement (pure): records, CSV, JSON, totals, roll-ups, a stored
statement read back, and the check of a statement file's own checksum.

Every CSV holds rows of one kind only (lines, totals per billed unit, subtotals per rolled-up
account), so a spreadsheet summing a money column of any of them gets the statement's total.
Each row carries the statement's number, date, status and checksum (STATEMENT_HEADER_COLUMNS);
statement_sha256 is the sha256 of the lines CSV with every statement_sha256 field left empty,
so a reader can check a file without the database (verify_statement_file).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import date
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slurmtel.chargeback.model import (
    COMPLETED_COLUMNS,
    FORMAT_VERSION,
    LINE_COLUMNS,
    ROLLUP_LEVELS,
    ROUNDING,
    SECONDS,
    SECONDS_PER_HOUR,
    STATEMENT_HEADER_COLUMNS,
    TOTALS_COLUMNS,
    CompletedJobCost,
    Statement,
    UnitTotals,
)
from slurmtel.chargeback.pricing import _round, totals
from slurmtel.errors import ChargebackError
from slurmtel.rows import ClosedStatement, StatementLine, sha256

FORMAT_NAME = "slurmtel chargeback statement"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json(value: Any) -> Any:
    # money, seconds and quantities stay exact: decimal strings, not binary floats
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, date):
        return value.isoformat()
    return value


def statement_header(statement: Statement, checksum: str = "") -> dict[str, Any]:
    """The columns that identify STATEMENT on each of its rows. An open statement has no
    number or date: it is a draft, not a statement of record."""
    return {
        "format_version": statement.format_version,
        "statement_number": statement.statement_number,
        "statement_date": statement.statement_date.isoformat() if statement.statement_date else None,
        "statement_status": statement.status,
        "statement_sha256": checksum,
        "month": statement.month,
        "currency": statement.currency,
    }


def line_fields(line: StatementLine) -> dict[str, Any]:
    fields = asdict(line)
    return {c: fields[c] for c in LINE_COLUMNS if c in fields}


def line_records(statement: Statement, checksum: str = "") -> list[dict[str, Any]]:
    header = statement_header(statement, checksum)
    return [{**header, **line_fields(line)} for line in statement.lines]


def records_csv(records: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    """One flat table: one header, one row per record (a spreadsheet imports it as is)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([_text(record.get(c)) for c in columns])
    return out.getvalue().encode("utf-8")


def statement_sha256(statement: Statement) -> str:
    """The statement's own checksum: sha256 of its lines CSV with statement_sha256 empty."""
    return sha256(records_csv(line_records(statement), LINE_COLUMNS))


def render_csv(statement: Statement) -> bytes:
    """The statement's lines, one row each, and nothing else (totals: render_totals_csv)."""
    return records_csv(line_records(statement, statement_sha256(statement)), LINE_COLUMNS)


def unit_record(unit: UnitTotals) -> dict[str, Any]:
    return asdict(unit)


def totals_records(statement: Statement) -> list[dict[str, Any]]:
    """One row per billed unit: the statement's lines of that unit summed."""
    header = statement_header(statement, statement_sha256(statement))
    return [{**header, **unit_record(unit)} for unit in statement.totals.by_unit]


def render_totals_csv(statement: Statement) -> bytes:
    return records_csv(totals_records(statement), TOTALS_COLUMNS)


def completed_record(month: str, currency: str, cost: CompletedJobCost) -> dict[str, Any]:
    record = {"month": month, "currency": currency, **asdict(cost)}
    return {c: record[c] for c in COMPLETED_COLUMNS}


def render_completed_csv(statement: Statement) -> bytes:
    """Cost per completed job per account, one flat table of its own."""
    return records_csv(
        (completed_record(statement.month, statement.currency, c) for c in statement.completed_jobs),
        COMPLETED_COLUMNS,
    )


def rollup_account(account: str, level: str, parents: Mapping[str, frozenset[str]]) -> str:
    """The account ACCOUNT rolls up to at LEVEL: itself, its parent, or its top-level account
    (the one right below Slurm's `root`). An account the tree does not know is its own parent
    and top; where an account has parents in several clusters, the first by name."""
    if level == "account":
        return account

    def parent_of(name: str) -> str | None:
        found = sorted(parents.get(name, ()))
        return found[0] if found and found[0] != "root" else None

    if level == "parent":
        return parent_of(account) or account
    seen = {account}
    current = account
    while (up := parent_of(current)) is not None and up not in seen:
        seen.add(up)
        current = up
    return current


def rollup_key(line: StatementLine, level: str, parents: Mapping[str, frozenset[str]]) -> str:
    """What LINE is subtotalled under at LEVEL: an account of the tree, or its ledger code."""
    if level in ("pi", "cost_centre", "gl_code"):
        return str(getattr(line, level))
    return rollup_account(line.account, level, parents)


def rollup_records(
    statement: Statement, level: str, parents: Mapping[str, frozenset[str]]
) -> list[dict[str, Any]]:
    """One subtotal row per account the lines roll up to at LEVEL (or per PI, cost centre or
    GL code) and billed unit, nothing else: subtotals are sums of the rounded lines, so the rows
    add up to the total exactly."""
    if level not in ROLLUP_LEVELS:
        raise ChargebackError(f"--by must be one of {', '.join(ROLLUP_LEVELS)}, not '{level}'")
    groups: dict[str, list[StatementLine]] = {}
    for line in statement.lines:
        groups.setdefault(rollup_key(line, level, parents), []).append(line)
    header = statement_header(statement, statement_sha256(statement))
    return [
        {**header, "rollup_level": level, "rollup_account": group, **unit_record(unit)}
        for group in sorted(groups)
        for unit in totals(groups[group], statement.currency).by_unit
    ]


def for_pi(statement: Statement, pi: str) -> Statement:
    """The statement of one PI: the lines whose pi is PI (their accounts and sub-accounts),
    their totals, and the cost per completed job of their accounts. Its number, date and status
    are the site statement's; its statement_sha256 is of its own lines."""
    lines = tuple(line for line in statement.lines if line.pi == pi)
    accounts = {line.account for line in lines}
    return replace(
        statement,
        lines=lines,
        totals=totals(lines, statement.currency),
        completed_jobs=tuple(c for c in statement.completed_jobs if c.account in accounts),
        pi=pi,
    )


def render_json(statement: Statement) -> bytes:
    """The statement as one JSON document: its identity (number, date, status, checksum of its
    lines and the sha256 of its CSV file), its lines, totals and cost per completed job."""
    checksum = statement_sha256(statement)
    header_columns = set(STATEMENT_HEADER_COLUMNS)
    document = {
        "format": FORMAT_NAME,
        **{k: _json(v) for k, v in statement_header(statement, checksum).items()},
        "csv_sha256": sha256(render_csv(statement)),
        "pi": statement.pi,
        "month_start_at": statement.month_start_at.isoformat() if statement.month_start_at else None,
        "month_end_at": statement.month_end_at.isoformat() if statement.month_end_at else None,
        "closed_at": statement.closed_at.isoformat() if statement.closed_at else None,
        "rounding": ROUNDING,
        "lines": [
            {k: _json(v) for k, v in line_fields(line).items() if k not in header_columns}
            for line in statement.lines
        ],
        "totals": totals_data(statement),
        "completed_jobs": [
            {k: _json(v) for k, v in completed_record(statement.month, statement.currency, c).items()}
            for c in statement.completed_jobs
        ],
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def totals_data(statement: Statement) -> dict[str, Any]:
    """The statement's totals as JSON data (the stored `totals` of a closed statement)."""
    t = statement.totals
    return {
        "line_count": t.line_count,
        "unpriced_line_count": t.unpriced_line_count,
        "amount": _json(t.amount),
        "waived_amount": _json(t.waived_amount),
        "billable_amount": _json(t.billable_amount),
        "by_unit": [{k: _json(v) for k, v in unit_record(u).items()} for u in t.by_unit],
    }


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name) if name else None
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _completed_cost(c: Mapping[str, Any]) -> CompletedJobCost:
    def money(name: str) -> Decimal | None:
        return None if c.get(name) is None else Decimal(str(c[name]))

    if "gpu_hours" in c:  # format 1
        gpu_seconds = Decimal(str(c["gpu_hours"])) * SECONDS_PER_HOUR
        unpriced = 1 if Decimal(str(c.get("unpriced_gpu_hours") or "0")) else 0
    else:
        gpu_seconds = Decimal(str(c["allocated_gpu_seconds"]))
        unpriced = int(c["unpriced_line_count"])
    return CompletedJobCost(
        account=str(c["account"]),
        completed_jobs=int(c["completed_jobs"]),
        allocated_gpu_seconds=_round(gpu_seconds, SECONDS),
        amount=money("amount"),
        billable_amount=money("billable_amount"),
        unpriced_line_count=unpriced,
        cost_per_completed_job=money("cost_per_completed_job"),
        billable_per_completed_job=money("billable_per_completed_job"),
    )


def statement_of_closed(stored: ClosedStatement) -> Statement:
    """A closed statement's figures as a Statement (for views derived from it: totals,
    roll-ups, parquet, FOCUS); its stored bytes stay the statement of record. A format-1
    statement's lines come converted (slurmtel.rows.line_from_format_1) and it has no number."""
    currency = str(stored.settings.get("currency", "EUR"))
    zone = _zone(str(stored.settings.get("timezone", "")))
    closed_on = stored.closed_at.astimezone(zone).date() if zone else stored.closed_at.date()
    return Statement(
        month=stored.month,
        currency=currency,
        lines=stored.lines,
        totals=totals(stored.lines, currency),
        completed_jobs=tuple(_completed_cost(c) for c in stored.completed_jobs),
        settings=stored.settings,
        status="closed",
        closed_at=stored.closed_at,
        statement_number=stored.statement_number,
        statement_date=closed_on,
        month_start_at=stored.month_start_at,
        month_end_at=stored.month_end_at,
        format_version=stored.format_version,
    )


def closed(statement: Statement, *, closed_at: Any, number: int, on: date) -> Statement:
    """STATEMENT as it is closed: its number and date set, the current format."""
    return replace(
        statement,
        status="closed",
        closed_at=closed_at,
        statement_number=number,
        statement_date=on,
        format_version=FORMAT_VERSION,
    )


def verify_statement_file(data: bytes) -> str:
    """Check a statement file (format 2 CSV lines or JSON) against its own statement_sha256;
    the checksum on success, ChargebackError when it does not match or the file has none."""
    text = data.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ChargebackError(f"not a statement: invalid JSON ({exc.msg})") from None
        if not isinstance(document, dict) or not document.get("statement_sha256"):
            raise ChargebackError("not a format 2 statement: its JSON has no statement_sha256")
        claimed = str(document["statement_sha256"])
        header = {c: document.get(c) for c in STATEMENT_HEADER_COLUMNS} | {"statement_sha256": ""}
        lines = document.get("lines") or []
        actual = sha256(records_csv(({**header, **line} for line in lines), LINE_COLUMNS))
        if actual != claimed:
            raise ChargebackError(
                f"the statement's lines were changed: their sha256 is {actual}, the file says {claimed}"
            )
        return claimed
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or "statement_sha256" not in rows[0]:
        raise ChargebackError("not a format 2 statement: its CSV has no statement_sha256 column")
    at = rows[0].index("statement_sha256")
    claimed_all = {row[at] for row in rows[1:] if len(row) > at}
    if len(claimed_all) != 1:
        raise ChargebackError("the statement's rows disagree on statement_sha256 (or it has no lines)")
    (claimed,) = claimed_all
    for row in rows[1:]:
        if len(row) > at:
            row[at] = ""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    actual = sha256(out.getvalue().encode("utf-8"))
    if actual != claimed:
        raise ChargebackError(
            f"the statement's lines were changed: their sha256 is {actual}, the file says {claimed}"
        )
    return claimed
