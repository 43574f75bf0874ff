"""`slurmtel chargeback`: monthly statements for finance — export (csv, json, table, parquet),
roll-up by the account tree, close, list, void, audit, and the re-pricing diff."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from slurmtel.access import Action
from slurmtel.commands import common
from slurmtel.commands.argtypes import check_output_file
from slurmtel.commands.common import EXIT_ERROR, EXIT_OK, add_wide_argument, open_context, scope_for
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import render

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from slurmtel.chargeback import ClosedStatement, Statement

FORMATS = ("csv", "json", "table", "parquet", "focus", "focus-parquet")


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    from slurmtel.chargeback import ROLLUP_LEVELS

    chargeback = commands.add_parser(
        "chargeback",
        help="monthly statement per account x user x partition x GPU model (finance, admins)",
    )
    chargeback.add_argument("--month", metavar="YYYY-MM", help="the month (site.timezone)")
    chargeback.add_argument(
        "--format",
        choices=FORMATS,
        default="csv",
        help="output format (default csv; parquet needs pyarrow and --output); focus: the lines as FOCUS "
        "1.2 cost and usage rows, CSV (focus) or Parquet (focus-parquet, needs --output)",
    )
    add_wide_argument(chargeback)
    action = chargeback.add_mutually_exclusive_group()
    action.add_argument(
        "--close",
        action="store_true",
        help="freeze the month: store the statement; later exports return the same bytes",
    )
    action.add_argument(
        "--list", action="store_true", help="list closed and voided months with their checksums"
    )
    action.add_argument(
        "--void", metavar="YYYY-MM", help="void a closed month (with --reason) so that it can be closed again"
    )
    action.add_argument(
        "--diff", action="store_true", help="what would change if the closed --month were re-priced today"
    )
    action.add_argument(
        "--audit", action="store_true", help="who closed and voided which month, when and why"
    )
    action.add_argument(
        "--completed-jobs", action="store_true", help="cost per completed job per account of --month"
    )
    action.add_argument(
        "--totals",
        action="store_true",
        help="the statement's totals, one row per billed unit (the statement itself holds only lines)",
    )
    action.add_argument(
        "--verify",
        metavar="FILE",
        type=Path,
        help="check a statement file (CSV or JSON, format 2) against its own statement_sha256",
    )
    chargeback.add_argument(
        "--force",
        action="store_true",
        help="with --close: close a month without usage, or earlier than the latest closed one (audited)",
    )
    chargeback.add_argument(
        "--reason", default="", help="why a month is voided (with --void) or force-closed (with --force)"
    )
    chargeback.add_argument(
        "--by",
        choices=ROLLUP_LEVELS,
        help="subtotals per billed unit and account, parent or top-level account of the Slurm account "
        "tree, or per PI, cost centre or GL code",
    )
    chargeback.add_argument(
        "--pi", metavar="NAME", help="the statement of one PI: the lines of their accounts and sub-accounts"
    )
    chargeback.add_argument("--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    # a --month through slurmtel serve on a login node (api.url); the rest refuse there
    chargeback.set_defaults(handler=cmd_chargeback, through_api=True)


def cmd_chargeback(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.chargeback import (
        COMPLETED_COLUMNS,
        DIFF_COLUMNS,
        LINE_COLUMNS,
        ROLLUP_COLUMNS,
        TOTALS_COLUMNS,
        TREE_LEVELS,
        ChargebackError,
        build_statement,
        check_month,
        close_month,
        closed_statement,
        completed_record,
        diff_closed_month,
        for_pi,
        line_records,
        render_csv,
        render_json,
        rollup_records,
        statement_of_closed,
        statement_sha256,
        totals_records,
    )
    from slurmtel.reports.parquet import write_parquet

    if args.verify is not None:
        return _verify(args.verify)
    if args.format in ("parquet", "focus-parquet") and args.output is None:
        raise ConfigError(f"--format {args.format} writes a file: give --output FILE")
    if args.format.startswith("focus") and (args.totals or args.by or args.completed_jobs or args.diff):
        raise ConfigError(
            "--format focus writes a month's lines: not with --totals, --by, --completed-jobs, --diff"
        )
    if args.force and not args.close:
        raise ConfigError("--force goes with --close")
    if config.api.url:
        return _through_api(args, config)
    if args.void:
        return _void(args, config)
    if args.list or args.audit:
        return _listing(args, config)
    if not args.month:
        raise ConfigError("--month YYYY-MM is required (or --list, --audit, --void YYYY-MM, --verify FILE)")
    try:
        month = check_month(args.month)
    except ChargebackError as exc:
        raise ConfigError(str(exc)) from exc
    identity = common.current_identity(config)  # looked up at call time (tests replace it)
    scope = scope_for(config, Action.CLOSE_STATEMENTS if args.close else Action.VIEW_STATEMENTS, identity)
    from slurmtel.chargeback.export import check_begun

    # the month and --output are checked before a database is opened (or an embedded one started)
    now = common.site_now(config)
    check_begun(month, config, now)
    if args.output is not None:
        check_output_file(args.output, "--output")
    ctx = open_context(config)
    _say_rate_notices(ctx.engine, config)
    if args.diff:
        with ctx.engine.connect() as conn:
            rows = diff_closed_month(conn, config, month, now)
        if not rows:
            print(f"slurmtel: {month} re-priced today equals its closed statement", file=sys.stderr)
        _emit_records(rows, DIFF_COLUMNS, args, f"{month} re-priced today vs its closed statement")
        return EXIT_OK
    stored = closed_statement(ctx.engine, month)
    if args.close:
        if stored is not None:
            from slurmtel.chargeback.export import already_closed_notice

            print(f"slurmtel: {already_closed_notice(stored)}", file=sys.stderr)
            return EXIT_ERROR
        stored = close_month(
            ctx.engine, config, month, now, closed_by=identity.user, force=args.force, reason=args.reason
        )
        print(
            f"slurmtel: closed {month} at {stored.closed_at.isoformat()} as statement "
            f"{stored.statement_number}",
            file=sys.stderr,
        )
    if stored is not None:
        statement = statement_of_closed(stored)
    else:
        with ctx.engine.connect() as conn:
            statement = build_statement(conn, config, month, now, scope)
    if args.pi is not None:
        statement = for_pi(statement, args.pi)
        if not statement.lines:
            print(f"slurmtel: note: no line of {month} belongs to PI '{args.pi}'", file=sys.stderr)
    _warn_unpriced(statement)
    if args.completed_jobs:
        records = [completed_record(month, statement.currency, c) for c in statement.completed_jobs]
        _emit_records(records, COMPLETED_COLUMNS, args, f"Cost per completed job, {month}")
        return EXIT_OK
    if args.totals:
        _emit_records(
            totals_records(statement),
            TOTALS_COLUMNS,
            args,
            f"Chargeback {month} totals, {statement.currency}",
        )
        return EXIT_OK
    if args.by:
        parents: dict[str, frozenset[str]] = {}
        if args.by in TREE_LEVELS:
            if not config.access.sacctmgr_command:
                raise ConfigError(
                    f"--by {args.by} needs the Slurm account tree: access.sacctmgr_command is empty"
                )
            parents = common.account_tree(config)
        records = rollup_records(statement, args.by, parents)
        _emit_records(
            records, ROLLUP_COLUMNS, args, f"Chargeback {month} subtotals by {args.by}, {statement.currency}"
        )
        return EXIT_OK
    if args.format.startswith("focus"):
        from slurmtel.chargeback.focus import focus_records, render_focus_csv, write_focus_parquet

        records = focus_records(statement, config.chargeback.provider_name)
        if args.format == "focus":
            _write(args.output, render_focus_csv(records))
        else:
            write_focus_parquet(records, args.output, statement.currency)
    elif args.format == "table":
        _write_table(args.output, lambda out: _table(statement, out))
    elif args.format == "parquet":
        write_parquet(
            line_records(statement, statement_sha256(statement)),
            LINE_COLUMNS,
            args.output,
            statement.currency,
        )
    elif stored is not None and args.pi is None:
        _emit_closed(stored, args)
    else:
        _write(args.output, render_csv(statement) if args.format == "csv" else render_json(statement))
    return EXIT_OK


def _verify(path: Path) -> int:
    from slurmtel.chargeback import ChargebackError, verify_statement_file

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--verify: cannot read {path}: {exc.strerror}") from None
    try:
        checksum = verify_statement_file(data)
    except ChargebackError as exc:
        print(f"slurmtel: {path}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(f"slurmtel: {path}: the lines match their statement_sha256 {checksum}", file=sys.stderr)
    return EXIT_OK


def _through_api(args: argparse.Namespace, config: Config) -> int:
    """A login node (`[api] url`): the month's CSV or JSON from `slurmtel serve`, closed first
    with --close; the server decides who may (finance, admins)."""
    from slurmtel.api.client import ApiClient, say

    other = args.list or args.audit or args.void or args.diff or args.completed_jobs or args.by or args.totals
    if args.force:
        raise ConfigError("--force closes a month on the head node only (it is audited there)")
    if other or args.format not in ("csv", "json"):
        raise ConfigError(
            "through the read API (api.url) chargeback exports a --month as csv or json and closes it "
            "(--close); run the others on the head node"
        )
    if not args.month:
        raise ConfigError("--month YYYY-MM is required")
    data, notices, refused = ApiClient(config).statement(args.month, fmt=args.format, close=args.close)
    say(notices)
    if refused:
        return EXIT_ERROR
    _write(args.output, data)
    return EXIT_OK


def _say_rate_notices(engine: Engine, config: Config) -> None:
    from slurmtel.chargeback import rate_notices
    from slurmtel.store.chargeback import closed_settings

    with engine.connect() as conn:
        closed = closed_settings(conn)
    for notice in rate_notices(config, closed):
        print(f"slurmtel: note: {notice}", file=sys.stderr)


def _void(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.chargeback import ChargebackError, check_month, void_month

    try:
        month = check_month(args.void)
    except ChargebackError as exc:
        raise ConfigError(str(exc)) from exc
    if not args.reason.strip():
        raise ConfigError("--void needs --reason TEXT: why the statement is voided is kept with it")
    identity = common.current_identity(config)
    scope_for(config, Action.CLOSE_STATEMENTS, identity)
    ctx = open_context(config)
    try:
        voided = void_month(ctx.engine, month, ctx.clock(), identity.user, args.reason)
    except ChargebackError as exc:
        print(f"slurmtel: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(
        f"slurmtel: voided {month} (closed {voided.closed_at.isoformat()} by {voided.closed_by or '?'}, "
        f"CSV sha256 {voided.csv_sha256}); the statement is kept in `chargeback --list` and the month "
        "can be closed again",
        file=sys.stderr,
    )
    return EXIT_OK


def _listing(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.chargeback.export import audit_listing, statement_listing

    identity = common.current_identity(config)
    scope_for(config, Action.VIEW_STATEMENTS, identity)
    ctx = open_context(config)
    if args.audit:
        rows = audit_listing(ctx.engine)
        columns: Sequence[str] = AUDIT_COLUMNS
        title = "Chargeback audit"
    else:
        rows = statement_listing(ctx.engine)
        columns, title = LISTING_COLUMNS, "Closed and voided statements"
    _emit_records(rows, columns, args, title)
    return EXIT_OK


LISTING_COLUMNS = (
    "statement_number",
    "month",
    "status",
    "format_version",
    "closed_at",
    "closed_by",
    "billable_amount",
    "currency",
    "csv_sha256",
    "json_sha256",
    "voided_at",
    "voided_by",
    "reason",
)
AUDIT_COLUMNS = ("action_at", "actor", "action", "month", "csv_sha256", "reason")


def _emit_records(
    records: Sequence[Mapping[str, Any]], columns: Sequence[str], args: argparse.Namespace, title: str
) -> None:
    from slurmtel.chargeback import records_csv
    from slurmtel.reports.parquet import write_parquet

    if args.format == "parquet":
        write_parquet(records, columns, args.output, "")
    elif args.format == "table":
        _write_table(args.output, lambda out: render(records, out, "table", columns=columns, title=title))
    elif args.format == "csv":
        _write(args.output, records_csv(records, columns))
    else:
        out = io.StringIO()
        render(records, out, "json", columns=columns)
        _write(args.output, out.getvalue().encode("utf-8"))


def _emit_closed(stored: ClosedStatement, args: argparse.Namespace) -> None:
    data = stored.csv if args.format == "csv" else stored.json
    digest = stored.csv_sha256 if args.format == "csv" else stored.json_sha256
    print(
        f"slurmtel: {stored.month} closed at {stored.closed_at.isoformat()}; "
        f"{args.format.upper()} sha256 {digest}",
        file=sys.stderr,
    )
    # checksums were verified on read: the stored bytes go out unchanged
    _write(args.output, data)


def _warn_unpriced(statement: Statement) -> None:
    from slurmtel.chargeback.export import unpriced_notice

    notice = unpriced_notice(statement)
    if notice:
        print(f"slurmtel: {notice}", file=sys.stderr)


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
    from slurmtel.chargeback import (
        COMPLETED_COLUMNS,
        LINE_COLUMNS,
        STATEMENT_HEADER_COLUMNS,
        TOTALS_COLUMNS,
        completed_record,
        line_records,
        totals_records,
    )

    if statement.status == "closed":
        status = f"statement {statement.statement_number} of {statement.statement_date}, closed"
    else:
        status = "open (not closed yet)"
    # the header columns are the same on every row: in the title instead
    title = f"Chargeback {statement.month}, {status}, {statement.currency}"
    render(
        line_records(statement),
        out,
        "table",
        columns=[c for c in LINE_COLUMNS if c not in STATEMENT_HEADER_COLUMNS],
        title=title,
    )
    out.write("\n")
    render(
        totals_records(statement),
        out,
        "table",
        columns=[c for c in TOTALS_COLUMNS if c not in STATEMENT_HEADER_COLUMNS],
        title="Totals per billed unit",
    )
    out.write("\n")
    render(
        [completed_record(statement.month, statement.currency, c) for c in statement.completed_jobs],
        out,
        "table",
        columns=COMPLETED_COLUMNS,
        title="Cost per completed job",
    )
