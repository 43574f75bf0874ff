"""The exact bytes of a statement (pure): records, CSV, JSON, rollups, and a stored statement
read back."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from slurmtel.chargeback.model import (
    COMPLETED_COLUMNS,
    LINE_COLUMNS,
    RATE_UNIT_BILLING,
    RATE_UNIT_GPU,
    ROLLUP_LEVELS,
    ROUNDING,
    CompletedJobCost,
    Statement,
    Totals,
)
from slurmtel.chargeback.pricing import totals
from slurmtel.errors import ChargebackError
from slurmtel.rows import (
    ClosedStatement,
    StatementLine,
)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json(value: Any) -> Any:
    # money and hours stay exact: decimal strings, not binary floats
    return str(value) if isinstance(value, Decimal) else value


def line_record(month: str, currency: str, line: StatementLine) -> dict[str, Any]:
    record = {"month": month, "currency": currency, **asdict(line)}
    return {c: record[c] for c in LINE_COLUMNS}


def totals_record(statement: Statement) -> dict[str, Any]:
    return _summary_record(statement, "total", statement.totals, statement.lines)


def _summary_record(
    statement: Statement, kind: str, t: Totals, lines: Sequence[StatementLine]
) -> dict[str, Any]:
    unit = lines[0].rate_unit if lines else _unit(statement.settings)
    return {
        "month": statement.month,
        "kind": kind,
        "for_month": "",
        "cluster": "",
        "account": "",
        "user": "",
        "partition": "",
        "gpu_model": "",
        "gpu_hours": t.gpu_hours,
        "billing_hours": t.billing_hours,
        "priced": t.priced,
        "rate": None,
        "rate_unit": unit,
        "amount": t.amount,
        "waived_gpu_hours": t.waived_gpu_hours,
        "waived_amount": t.waived_amount,
        "billable_amount": t.billable_amount,
        "unpriced_gpu_hours": t.unpriced_gpu_hours,
        "currency": statement.currency,
        "cause": "",
    }


def _unit(settings: Mapping[str, Any]) -> str:
    return RATE_UNIT_BILLING if settings.get("use_billing_tres") else RATE_UNIT_GPU


def completed_record(month: str, currency: str, cost: CompletedJobCost) -> dict[str, Any]:
    record = {"month": month, "currency": currency, **asdict(cost)}
    return {c: record[c] for c in COMPLETED_COLUMNS}


def statement_records(statement: Statement) -> list[dict[str, Any]]:
    """The lines then the totals line, as column -> value."""
    lines = [line_record(statement.month, statement.currency, line) for line in statement.lines]
    return [*lines, totals_record(statement)]


def records_csv(records: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    """One flat table: one header, one row per record (a spreadsheet imports it as is)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([_text(record[c]) for c in columns])
    return out.getvalue().encode("utf-8")


def render_csv(statement: Statement) -> bytes:
    """The statement as one flat table: its lines, then the `total` row (kind marks it)."""
    return records_csv(statement_records(statement), LINE_COLUMNS)


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


def rollup_records(
    statement: Statement, level: str, parents: Mapping[str, frozenset[str]]
) -> list[dict[str, Any]]:
    """The statement's lines grouped by the account they roll up to at LEVEL, each group
    followed by its `subtotal` row, then the `total` row. Subtotals are sums of the rounded
    lines, so they add up to the total exactly."""
    if level not in ROLLUP_LEVELS:
        raise ChargebackError(f"--by must be one of {', '.join(ROLLUP_LEVELS)}, not '{level}'")
    groups: dict[str, list[StatementLine]] = {}
    for line in statement.lines:
        groups.setdefault(rollup_account(line.account, level, parents), []).append(line)
    records: list[dict[str, Any]] = []
    for group in sorted(groups):
        lines = groups[group]
        for line in lines:
            records.append(
                {
                    "rollup_level": level,
                    "rollup_account": group,
                    **line_record(statement.month, statement.currency, line),
                }
            )
        sub = totals(lines, statement.currency)
        records.append(
            {
                "rollup_level": level,
                "rollup_account": group,
                **_summary_record(statement, "subtotal", sub, lines),
                "account": group,
            }
        )
    records.append({"rollup_level": level, "rollup_account": "", **totals_record(statement)})
    return records


def render_json(statement: Statement) -> bytes:
    document = {
        "month": statement.month,
        "status": statement.status,
        "closed_at": statement.closed_at.isoformat() if statement.closed_at else None,
        "currency": statement.currency,
        "rounding": ROUNDING,
        "lines": [{k: _json(v) for k, v in r.items()} for r in statement_records(statement)[:-1]],
        "totals": {k: _json(v) for k, v in totals_record(statement).items()},
        "completed_jobs": [
            {k: _json(v) for k, v in completed_record(statement.month, statement.currency, c).items()}
            for c in statement.completed_jobs
        ],
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def statement_of_closed(stored: ClosedStatement) -> Statement:
    """A closed statement's figures as a Statement (for views derived from it: roll-ups,
    parquet); its stored bytes stay the statement of record."""
    currency = str(stored.settings.get("currency", "EUR"))
    return Statement(
        month=stored.month,
        currency=currency,
        lines=stored.lines,
        totals=totals(stored.lines, currency),
        completed_jobs=tuple(
            CompletedJobCost(
                account=str(c["account"]),
                completed_jobs=int(c["completed_jobs"]),
                gpu_hours=Decimal(str(c["gpu_hours"])),
                amount=None if c.get("amount") is None else Decimal(str(c["amount"])),
                billable_amount=None
                if c.get("billable_amount") is None
                else Decimal(str(c["billable_amount"])),
                unpriced_gpu_hours=Decimal(str(c["unpriced_gpu_hours"])),
                cost_per_completed_job=None
                if c.get("cost_per_completed_job") is None
                else Decimal(str(c["cost_per_completed_job"])),
                billable_per_completed_job=None
                if c.get("billable_per_completed_job") is None
                else Decimal(str(c["billable_per_completed_job"])),
            )
            for c in stored.completed_jobs
        ),
        settings=stored.settings,
        status="closed",
        closed_at=stored.closed_at,
    )
