"""`slurmtel chargeback --month YYYY-MM [--close]`: monthly statements for finance."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TextIO

from slurmtel.access import Action
from slurmtel.chargeback import (
    COMPLETED_COLUMNS,
    LINE_COLUMNS,
    ChargebackError,
    ClosedStatement,
    Statement,
    build_statement,
    check_month,
    close_month,
    closed_statement,
    completed_record,
    render_csv,
    render_json,
    statement_records,
)
from slurmtel.commands import common
from slurmtel.commands.common import EXIT_ERROR, EXIT_OK, open_context, scope_for
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import render

FORMATS = ("csv", "json", "table")


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    chargeback = commands.add_parser(
        "chargeback",
        help="monthly statement per account x user x partition x GPU model (finance, admins)",
    )
    chargeback.add_argument("--month", required=True, metavar="YYYY-MM", help="the month (site.timezone)")
    chargeback.add_argument("--format", choices=FORMATS, default="csv", help="output format (default csv)")
    chargeback.add_argument(
        "--close",
        action="store_true",
        help="freeze the month: store the statement; later exports return the same bytes",
    )
    chargeback.add_argument("--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    chargeback.set_defaults(handler=cmd_chargeback)


def cmd_chargeback(args: argparse.Namespace, config: Config) -> int:
    try:
        month = check_month(args.month)
    except ChargebackError as exc:
        raise ConfigError(str(exc)) from exc
    identity = common.current_identity(config)  # looked up at call time (tests replace it)
    scope = scope_for(config, Action.CLOSE_STATEMENTS if args.close else Action.VIEW_STATEMENTS, identity)
    ctx = open_context(config)
    now = ctx.clock()
    stored = closed_statement(ctx.engine, month)
    if args.close:
        if stored is not None:
            print(
                f"slurmtel: {month} is already closed (at {stored.closed_at.isoformat()}, "
                f"CSV sha256 {stored.csv_sha256}); it is not closed twice — data that arrives for "
                "it appears as adjustments in the next open month",
                file=sys.stderr,
            )
            return EXIT_ERROR
        stored = close_month(ctx.engine, config, month, now, closed_by=identity.user)
        print(f"slurmtel: closed {month} at {stored.closed_at.isoformat()}", file=sys.stderr)
    if stored is not None:
        _warn_unpriced(str(stored.totals.get("unpriced_gpu_hours", "0")))
        _emit_closed(stored, args)
        return EXIT_OK
    with ctx.engine.connect() as conn:
        statement = build_statement(conn, config, month, now, scope)
    _warn_unpriced(str(statement.totals.unpriced_gpu_hours))
    if args.format == "table":
        _write_table(args.output, lambda out: _table(statement, out))
    else:
        _write(args.output, render_csv(statement) if args.format == "csv" else render_json(statement))
    return EXIT_OK


def _emit_closed(stored: ClosedStatement, args: argparse.Namespace) -> None:
    if args.format == "table":
        _write_table(args.output, lambda out: _closed_table(stored, out))
        return
    data = stored.csv if args.format == "csv" else stored.json
    digest = stored.csv_sha256 if args.format == "csv" else stored.json_sha256
    print(
        f"slurmtel: {stored.month} closed at {stored.closed_at.isoformat()}; "
        f"{args.format.upper()} sha256 {digest}",
        file=sys.stderr,
    )
    # checksums were verified on read: the stored bytes go out unchanged
    _write(args.output, data)


def _warn_unpriced(unpriced_gpu_hours: str) -> None:
    if Decimal(unpriced_gpu_hours or "0") != 0:
        print(
            f"slurmtel: warning: {unpriced_gpu_hours} GPU-hours match no [[chargeback.rates]] entry: "
            "they are listed unpriced (priced=false), not charged",
            file=sys.stderr,
        )


def _write(output: Path | None, data: bytes) -> None:
    if output is not None:
        output.write_bytes(data)
        return
    sys.stdout.write(data.decode("utf-8"))
    sys.stdout.flush()


def _write_table(output: Path | None, write: Callable[[TextIO], None]) -> None:
    # rich on a terminal, plain text in a file or pipe
    if output is None:
        write(sys.stdout)
        return
    out = io.StringIO()
    write(out)
    output.write_text(out.getvalue())


def _table(statement: Statement, out: TextIO) -> None:
    status = "closed" if statement.status == "closed" else "open (not closed yet)"
    render(
        statement_records(statement),
        out,
        "table",
        columns=LINE_COLUMNS,
        title=f"Chargeback {statement.month}, {status}, {statement.currency}",
    )
    out.write("\n")
    render(
        [completed_record(statement.month, statement.currency, c) for c in statement.completed_jobs],
        out,
        "table",
        columns=COMPLETED_COLUMNS,
        title="Cost per completed job",
    )


def _closed_table(stored: ClosedStatement, out: TextIO) -> None:
    document = json.loads(stored.json)
    render(
        [*document["lines"], document["totals"]],
        out,
        "table",
        columns=LINE_COLUMNS,
        title=f"Chargeback {stored.month}, closed {stored.closed_at.isoformat()}, {document['currency']}",
    )
    out.write("\n")
    render(
        document["completed_jobs"], out, "table", columns=COMPLETED_COLUMNS, title="Cost per completed job"
    )
