"""Chargeback against the database, through slurmtel.store.chargeback: build a statement,
close, void and diff a month (a close or a void holds store.locks' CLOSE_LOCK_KEY)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from slurmtel.access import EVERYTHING, Scope
from slurmtel.chargeback.model import ZERO, MonthAlreadyClosed, Statement
from slurmtel.chargeback.pricing import (
    _clean,
    adjustment_lines,
    assemble,
    check_month,
    frozen_pricing,
    month_due_for_closing,
    months_adjusted_in,
    price_usage,
)
from slurmtel.chargeback.render import _json, completed_record, render_csv, render_json, totals_record
from slurmtel.config import ChargebackConfig, Config
from slurmtel.errors import ChargebackError
from slurmtel.rows import (
    ClosedStatement,
    Key,
    StatementLine,
    sha256,
)
from slurmtel.timeparse import month_bounds

if TYPE_CHECKING:
    from sqlalchemy import Engine


def usage_lines(
    conn: Any,
    pricing: ChargebackConfig,
    month: str,
    bounds: tuple[datetime, datetime],
    now: datetime,
    scope: Scope,
) -> list[StatementLine]:
    """MONTH's usage in BOUNDS, priced with PRICING."""
    from slurmtel.store.chargeback import usage_figures

    start, end = bounds
    figures = usage_figures(
        conn, start=start, end=end, now=now, scope=scope, billing=pricing.use_billing_tres
    )
    return price_usage(figures, month, pricing)


def closed_usage_now(conn: Any, frozen: ClosedStatement, now: datetime, scope: Scope) -> list[StatementLine]:
    """A closed month's usage as the data stands NOW, cut at the edges and priced with the
    rates it was closed with: only usage that changed since can differ from its statement."""
    assert frozen.month_start_at is not None and frozen.month_end_at is not None
    bounds = (frozen.month_start_at, frozen.month_end_at)
    return usage_lines(conn, frozen_pricing(frozen.settings), frozen.month, bounds, now, scope)


def build_statement(
    conn: Any, config: Config, month: str, now: datetime, scope: Scope = EVERYTHING
) -> Statement:
    """MONTH's statement computed now (an open month): usage, adjustments, cost per job."""
    from slurmtel.store.chargeback import closed_months, completed_jobs_by_account, get_statements

    check_month(month)
    start, end = month_bounds(month, config.zone)
    usage = usage_lines(conn, config.chargeback, month, (start, end), now, scope)
    adjustments: list[StatementLine] = []
    closed = closed_months(conn)
    for earlier in months_adjusted_in(month, closed):
        statements = get_statements(conn, [m for m in closed if m >= earlier])
        frozen_statement = statements[earlier]
        if frozen_statement.settings.get("currency") != config.chargeback.currency:
            raise ChargebackError(
                f"{earlier} was closed in {frozen_statement.settings.get('currency')}, the config says "
                f"{config.chargeback.currency}: adjustments cannot mix currencies"
            )
        frozen = [line for line in frozen_statement.lines if line.kind == "usage"]
        already = [
            line
            for later, s in statements.items()
            if later > earlier
            for line in s.lines
            if line.kind == "adjustment" and line.for_month == earlier
        ]
        current = closed_usage_now(conn, frozen_statement, now, scope)
        adjustments += adjustment_lines(earlier, current, frozen, already)
    completed = completed_jobs_by_account(
        conn, start=start, end=end, scope=scope, billing=config.chargeback.use_billing_tres
    )
    return assemble(month, config.chargeback, usage, adjustments, completed, config.timezone_name)


def diff_records(
    month: str, currency: str, closed: Sequence[StatementLine], now: Sequence[StatementLine]
) -> list[dict[str, Any]]:
    """Per key, the closed statement's usage line beside the same month re-priced today;
    keys whose hours, rate and billable amount are all unchanged are left out."""
    by_key: dict[Key, list[StatementLine | None]] = {}
    for line in closed:
        by_key.setdefault(line.key, [None, None])[0] = line
    for line in now:
        by_key.setdefault(line.key, [None, None])[1] = line
    records = []
    for key in sorted(by_key):
        before, after = by_key[key]
        figures = [
            (line.gpu_hours, line.rate, line.billable_amount) if line is not None else (ZERO, None, None)
            for line in (before, after)
        ]
        if figures[0] == figures[1]:
            continue
        change = (figures[1][2] or ZERO) - (figures[0][2] or ZERO)
        records.append(
            {
                "month": month,
                **dict(zip(("cluster", "account", "user", "partition", "gpu_model"), key, strict=True)),
                "closed_gpu_hours": figures[0][0],
                "now_gpu_hours": figures[1][0],
                "closed_rate": figures[0][1],
                "now_rate": figures[1][1],
                "closed_billable_amount": figures[0][2],
                "now_billable_amount": figures[1][2],
                "billable_amount_change": _clean(change),
                "currency": currency,
            }
        )
    return records


def diff_closed_month(conn: Any, config: Config, month: str, now: datetime) -> list[dict[str, Any]]:
    """What would change if closed MONTH were re-priced today: today's rates, time zone and
    data against its frozen usage lines. Changes nothing."""
    from slurmtel.store.chargeback import get_statements

    frozen = get_statements(conn, [check_month(month)]).get(month)
    if frozen is None:
        raise ChargebackError(
            f"{month} is not closed: --diff compares a closed statement with today's pricing"
        )
    bounds = month_bounds(month, config.zone)
    current = usage_lines(conn, config.chargeback, month, bounds, now, EVERYTHING)
    closed_usage = [line for line in frozen.lines if line.kind == "usage"]
    return diff_records(month, config.chargeback.currency, closed_usage, current)


def close_month(
    engine: Engine, config: Config, month: str, now: datetime, closed_by: str = ""
) -> ClosedStatement:
    """Freeze MONTH: compute its statement, store its exact bytes and checksums; once only."""
    from slurmtel.store.chargeback import get_statements, insert_audit, insert_statement
    from slurmtel.store.locks import CLOSE_LOCK_KEY, advisory_xact_lock

    check_month(month)
    start, end = month_bounds(month, config.zone)
    if now < end:
        raise ChargebackError(f"{month} has not ended yet (it ends {end.isoformat()}): it cannot be closed")
    with engine.begin() as conn:
        advisory_xact_lock(conn, CLOSE_LOCK_KEY)
        existing = get_statements(conn, [month]).get(month)
        if existing is not None:
            raise MonthAlreadyClosed(
                f"{month} is already closed (at {existing.closed_at.isoformat()}, CSV sha256 "
                f"{existing.csv_sha256}); data that arrives for it appears as adjustments in the "
                "next open month"
            )
        statement = replace(build_statement(conn, config, month, now), status="closed", closed_at=now)
        csv_bytes, json_bytes = render_csv(statement), render_json(statement)
        closed = ClosedStatement(
            month=month,
            closed_at=now,
            closed_by=closed_by,
            csv=csv_bytes,
            json=json_bytes,
            csv_sha256=sha256(csv_bytes),
            json_sha256=sha256(json_bytes),
            lines=statement.lines,
            totals={k: _json(v) for k, v in totals_record(statement).items()},
            completed_jobs=tuple(
                {k: _json(v) for k, v in completed_record(month, statement.currency, c).items()}
                for c in statement.completed_jobs
            ),
            settings=statement.settings,
            month_start_at=start,
            month_end_at=end,
        )
        insert_statement(conn, closed, start=start, end=end)
        insert_audit(conn, at=now, actor=closed_by, action="close", month=month, csv_sha256=closed.csv_sha256)
    return closed


def void_month(engine: Engine, month: str, now: datetime, voided_by: str, reason: str) -> ClosedStatement:
    """Void closed MONTH: its statement is kept, bytes and all, among the voided ones, and
    the month may be closed again. Only the latest closed month: a later closed statement may
    hold adjustments computed against this one (void that one first)."""
    from slurmtel.store.chargeback import closed_months, get_statements, insert_audit, move_to_voided
    from slurmtel.store.locks import CLOSE_LOCK_KEY, advisory_xact_lock

    check_month(month)
    if not reason.strip():
        raise ChargebackError("--void needs --reason: why the statement is voided is kept with it")
    with engine.begin() as conn:
        advisory_xact_lock(conn, CLOSE_LOCK_KEY)
        stored = get_statements(conn, [month]).get(month)
        if stored is None:
            raise ChargebackError(f"{month} is not closed: there is no statement to void")
        later = [m for m in closed_months(conn) if m > month]
        if later:
            raise ChargebackError(
                f"{month} cannot be voided while later months are closed ({', '.join(later)}): their "
                "adjustments were computed against it; void them first, latest first"
            )
        move_to_voided(conn, month, voided_at=now, voided_by=voided_by, reason=reason.strip())
        insert_audit(
            conn,
            at=now,
            actor=voided_by,
            action="void",
            month=month,
            csv_sha256=stored.csv_sha256,
            reason=reason,
        )
    return stored


def closed_statement(engine: Engine, month: str) -> ClosedStatement | None:
    """MONTH's stored statement (checksums verified), or None while the month is open."""
    from slurmtel.store.chargeback import get_statements

    check_month(month)
    with engine.connect() as conn:
        found = get_statements(conn, [month]).get(month)
    return found.verified() if found is not None else None


def close_due_month(engine: Engine, config: Config, now: datetime) -> ClosedStatement | None:
    """For the daemon: close the previous month once close_day_of_month has come. A month
    finance voided is closed again only by hand (after whatever was wrong is fixed)."""
    from slurmtel.store.chargeback import voided_months

    month = month_due_for_closing(config, now)
    if month is None or closed_statement(engine, month) is not None:
        return None
    with engine.connect() as conn:
        if month in voided_months(conn):
            return None
    try:
        return close_month(engine, config, month, now, closed_by="slurmtel daemon")
    except MonthAlreadyClosed:
        return None
