"""A month's statement as the bytes finance downloads (CSV or JSON), closing it first when
asked: what `slurmtel chargeback --month M [--close]` writes and what the read API serves at
`/v1/chargeback/{month}`, with the notes the CLI prints beside it.

A closed month is its stored bytes, unchanged (checksums verified on read); an open month is
computed now. ENGINE must read every row: the read API passes an engine whose transactions are
scoped to everything (only finance and admins reach this).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import Scope
from slurmtel.chargeback.closing import build_statement, close_month, closed_statement
from slurmtel.chargeback.model import Statement
from slurmtel.chargeback.pricing import check_month, rate_notices
from slurmtel.chargeback.render import render_csv, render_json, statement_of_closed
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.rows import ClosedStatement
from slurmtel.store.chargeback import closed_settings
from slurmtel.timeparse import month_bounds


@dataclass(frozen=True)
class ExportedStatement:
    data: bytes
    # what the CLI says on stderr beside the statement, in order
    notices: tuple[str, ...]
    # asked to close a month that already was: nothing was done, DATA is empty
    refused: bool = False


def unpriced_notice(statement: Statement) -> str | None:
    """The warning beside a statement with lines no rate prices (they are listed, not free)."""
    units = [u for u in statement.totals.by_unit if u.unpriced_line_count]
    if not units:
        return None
    what = ", ".join(f"{u.unpriced_quantity} {u.billed_unit}" for u in units)
    return (
        f"warning: {sum(u.unpriced_line_count for u in units)} line(s) ({what}) match no "
        "[[chargeback.rates]] entry: they are listed unpriced (priced=false), not charged"
    )


def check_begun(month: str, config: Config, now: datetime) -> None:
    """ConfigError for a month that has not begun in the site's zone: nothing to bill yet."""
    try:
        start, _ = month_bounds(month, config.zone)
    except ValueError as exc:
        raise ConfigError(f"--month: {exc}") from exc
    if start > now:
        raise ConfigError(
            f"{month} has not begun yet (it starts {start.isoformat()}): there is nothing to bill"
        )


def already_closed_notice(stored: ClosedStatement) -> str:
    return (
        f"{stored.month} is already closed (at {stored.closed_at.isoformat()}, CSV sha256 "
        f"{stored.csv_sha256}); it is not closed twice — data that arrives for it appears as "
        "adjustments in the next open month"
    )


def export_statement(
    engine: Engine,
    config: Config,
    month: str,
    now: datetime,
    *,
    scope: Scope,
    fmt: str,
    close: bool = False,
    closed_by: str = "",
    reason: str = "",
) -> ExportedStatement:
    """MONTH's statement as FMT ("csv" or "json") bytes; CLOSE freezes it first (REASON kept
    in the audit trail beside the closing)."""
    if not scope.everything:
        raise ConfigError("a statement covers every account: only finance and admins export it")
    month = check_month(month)
    check_begun(month, config, now)
    with engine.connect() as conn:
        closed = closed_settings(conn)
    notices = [f"note: {n}" for n in rate_notices(config, closed)]
    stored = closed_statement(engine, month)
    if close:
        if stored is not None:
            notices.append(already_closed_notice(stored))
            return ExportedStatement(b"", tuple(notices), refused=True)
        stored = close_month(engine, config, month, now, closed_by=closed_by, reason=reason)
        notices.append(f"closed {month} at {stored.closed_at.isoformat()}")
    if stored is not None:
        unpriced = unpriced_notice(statement_of_closed(stored))
        notices.extend([unpriced] if unpriced else [])
        digest = stored.csv_sha256 if fmt == "csv" else stored.json_sha256
        notices.append(
            f"{stored.month} closed at {stored.closed_at.isoformat()}; {fmt.upper()} sha256 {digest}"
        )
        return ExportedStatement(stored.csv if fmt == "csv" else stored.json, tuple(notices))
    with engine.connect() as conn:
        statement = build_statement(conn, config, month, now, scope)
    unpriced = unpriced_notice(statement)
    notices.extend([unpriced] if unpriced else [])
    return ExportedStatement(
        render_csv(statement) if fmt == "csv" else render_json(statement), tuple(notices)
    )


def statement_parquet(engine: Engine, config: Config, month: str, now: datetime, *, scope: Scope) -> bytes:
    """MONTH's lines as the Parquet file `slurmtel chargeback --month M --format parquet` writes
    (a closed month's stored lines, else computed now), as bytes."""
    import tempfile
    from pathlib import Path

    from slurmtel.chargeback import LINE_COLUMNS, line_records, statement_sha256
    from slurmtel.reports.parquet import write_parquet

    if not scope.everything:
        raise ConfigError("a statement covers every account: only finance and admins export it")
    month = check_month(month)
    check_begun(month, config, now)
    stored = closed_statement(engine, month)
    if stored is not None:
        statement = statement_of_closed(stored)
    else:
        with engine.connect() as conn:
            statement = build_statement(conn, config, month, now, scope)
    with tempfile.TemporaryDirectory(prefix="slurmtel-parquet-") as tmp:
        path = Path(tmp) / f"{month}.parquet"
        write_parquet(
            line_records(statement, statement_sha256(statement)), LINE_COLUMNS, path, statement.currency
        )
        return path.read_bytes()


def statement_listing(engine: Engine) -> list[dict[str, Any]]:
    """`chargeback --list`: every closed and voided statement (LISTING columns), as rows."""
    from dataclasses import asdict

    from slurmtel.store.chargeback import list_statements

    with engine.connect() as conn:
        return [asdict(listing) for listing in list_statements(conn)]


def audit_listing(engine: Engine) -> list[dict[str, Any]]:
    """`chargeback --audit`: every close, void and forced close, oldest first, as rows."""
    from dataclasses import asdict

    from slurmtel.store.chargeback import audit_entries

    with engine.connect() as conn:
        return [{"action_at": e.at, **asdict(e)} for e in audit_entries(conn)]
