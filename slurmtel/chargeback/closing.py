"""Chargeback against the database, through slurmtel.store.chargeback: build a statement,
close, void and diff a month (a close or a void holds store.locks' CLOSE_LOCK_KEY)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from slurmtel.access import EVERYTHING, Scope
from slurmtel.chargeback.ledger import Ledger, load_ledger, with_codes
from slurmtel.chargeback.legacy import FORMAT_1, price_usage_format_1
from slurmtel.chargeback.model import ZERO, CloseRefused, MonthAlreadyClosed, Statement
from slurmtel.chargeback.pricing import (
    _clean,
    adjustment_lines,
    assemble,
    check_month,
    frozen_pricing,
    month_due_for_closing,
    months_adjusted_in,
    price_usage,
    priced_tres,
    settings_format,
)
from slurmtel.chargeback.render import (
    _json,
    closed,
    completed_record,
    render_csv,
    render_json,
    totals_data,
)
from slurmtel.config import ChargebackConfig, Config
from slurmtel.errors import ChargebackError
from slurmtel.rows import ClosedStatement, Key, StatementLine, sha256
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
    statement_format: int = 2,
) -> list[StatementLine]:
    """MONTH's usage in BOUNDS, priced with PRICING as statement format STATEMENT_FORMAT
    prices it (1 for a month closed before format 2)."""
    from slurmtel.store.chargeback import usage_figures, usage_figures_format_1

    start, end = bounds
    if statement_format == FORMAT_1:
        legacy = usage_figures_format_1(
            conn, start=start, end=end, now=now, scope=scope, billing=pricing.use_billing_tres
        )
        return price_usage_format_1(legacy, month, pricing)
    figures = usage_figures(conn, start=start, end=end, now=now, scope=scope, tres=priced_tres(pricing))
    return price_usage(figures, month, pricing)


def closed_usage_now(conn: Any, frozen: ClosedStatement, now: datetime, scope: Scope) -> list[StatementLine]:
    """A closed month's usage as the data stands NOW, cut at the edges and priced with the
    rates and the statement format it was closed with: only usage that changed since can
    differ from its statement."""
    assert frozen.month_start_at is not None and frozen.month_end_at is not None
    bounds = (frozen.month_start_at, frozen.month_end_at)
    pricing = frozen_pricing(frozen.settings)
    return usage_lines(conn, pricing, frozen.month, bounds, now, scope, settings_format(frozen.settings))


def build_statement(
    conn: Any,
    config: Config,
    month: str,
    now: datetime,
    scope: Scope = EVERYTHING,
    ledger: Ledger | None = None,
) -> Statement:
    """MONTH's statement computed now (an open month): usage, adjustments, cost per job, each
    line with its account's ledger codes (LEDGER; by default the site's, load_ledger)."""
    from slurmtel.store.chargeback import closed_months, completed_jobs_by_account, get_statements

    check_month(month)
    start, end = month_bounds(month, config.zone)
    usage = usage_lines(conn, config.chargeback, month, (start, end), now, scope)
    adjustments: list[StatementLine] = []
    closed_list = closed_months(conn)
    for earlier in months_adjusted_in(month, closed_list):
        statements = get_statements(conn, [m for m in closed_list if m >= earlier])
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
            if line.kind == "adjustment" and line.adjusted_month == earlier
        ]
        current = closed_usage_now(conn, frozen_statement, now, scope)
        adjustments += adjustment_lines(earlier, current, frozen, already)
    completed = completed_jobs_by_account(
        conn, start=start, end=end, scope=scope, billing=priced_tres(config.chargeback) != ("gres/gpu",)
    )
    codes = ledger if ledger is not None else load_ledger(config)
    return assemble(
        month,
        config.chargeback,
        with_codes(usage, codes),
        with_codes(adjustments, codes),
        completed,
        config.timezone_name,
        (start, end),
    )


def diff_records(
    month: str, currency: str, closed_lines: Sequence[StatementLine], now: Sequence[StatementLine]
) -> list[dict[str, Any]]:
    """Per key, the closed statement's usage line beside the same month re-priced today;
    keys whose TRES-seconds, rate and billable amount are all unchanged are left out."""
    by_key: dict[Key, list[StatementLine | None]] = {}
    for line in closed_lines:
        by_key.setdefault(line.key, [None, None])[0] = line
    for line in now:
        by_key.setdefault(line.key, [None, None])[1] = line
    records = []
    for key in sorted(by_key):
        before, after = by_key[key]
        figures = [
            (line.allocated_tres_seconds, line.rate, line.billable_amount)
            if line is not None
            else (ZERO, None, None)
            for line in (before, after)
        ]
        if figures[0] == figures[1]:
            continue
        change = (figures[1][2] or ZERO) - (figures[0][2] or ZERO)
        unit = (after or before).billed_unit  # type: ignore[union-attr]
        records.append(
            {
                "month": month,
                **dict(
                    zip(("cluster", "account", "user", "partition", "gpu_model", "tres"), key, strict=True)
                ),
                "closed_allocated_tres_seconds": figures[0][0],
                "now_allocated_tres_seconds": figures[1][0],
                "billed_unit": unit,
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


def close_guards(month: str, statement: Statement, closed_list: Sequence[str]) -> list[str]:
    """Why closing MONTH would likely be a mistake (empty when nothing is wrong): `--force`
    closes it anyway, and the audit trail says which of these it overrode."""
    reasons = []
    if not any(line.kind == "usage" for line in statement.lines):
        reasons.append(
            f"{month} has no usage: closing it freezes an empty statement (has sacct collected the month?)"
        )
    later = [m for m in closed_list if m > month]
    if later:
        reasons.append(
            f"{month} is earlier than {max(later)}, the latest closed month: its late usage was not "
            "charged as adjustments there, and undoing the close means voiding the later months first"
        )
    return reasons


def close_month(
    engine: Engine,
    config: Config,
    month: str,
    now: datetime,
    closed_by: str = "",
    *,
    force: bool = False,
    reason: str = "",
) -> ClosedStatement:
    """Freeze MONTH: compute its statement, number it, store its exact bytes and checksums;
    once only. A month without usage or earlier than the latest closed one is refused
    (CloseRefused) unless FORCE; a forced close is audited as `forced_close` with what it
    overrode (and REASON)."""
    from slurmtel.store.chargeback import (
        closed_months,
        get_statements,
        insert_audit,
        insert_statement,
        next_statement_number,
    )
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
        draft = build_statement(conn, config, month, now)
        overridden = close_guards(month, draft, closed_months(conn))
        if overridden and not force:
            raise CloseRefused("; ".join(overridden) + ". --force closes it anyway (audited)")
        number = next_statement_number(conn)
        statement = closed(draft, closed_at=now, number=number, on=now.astimezone(config.zone).date())
        csv_bytes, json_bytes = render_csv(statement), render_json(statement)
        stored = ClosedStatement(
            month=month,
            closed_at=now,
            closed_by=closed_by,
            csv=csv_bytes,
            json=json_bytes,
            csv_sha256=sha256(csv_bytes),
            json_sha256=sha256(json_bytes),
            lines=statement.lines,
            totals=totals_data(statement),
            completed_jobs=tuple(
                {k: _json(v) for k, v in completed_record(month, statement.currency, c).items()}
                for c in statement.completed_jobs
            ),
            settings=statement.settings,
            month_start_at=start,
            month_end_at=end,
            format_version=statement.format_version,
            statement_number=number,
        )
        insert_statement(conn, stored, start=start, end=end)
        audit_reason = "; ".join([*overridden, *([reason.strip()] if reason.strip() else [])])
        insert_audit(
            conn,
            at=now,
            actor=closed_by,
            action="forced_close" if overridden else "close",
            month=month,
            csv_sha256=stored.csv_sha256,
            reason=audit_reason,
        )
    return stored


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
    finance voided is closed again only by hand (after whatever was wrong is fixed); a month
    the guards refuse (no usage, a later month closed) raises CloseRefused: only a person
    forces a close."""
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
