"""The `slurmtel` command line.

Exit status: 0 ok, 1 error, 2 usage or configuration error, 3 done but some records were
quarantined (see `slurmtel quarantine list`).
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from slurmtel import __version__
from slurmtel.access import Action, Identity, Role, Scope, allowed
from slurmtel.config import Config, load_config
from slurmtel.errors import ConfigError, SlurmtelError
from slurmtel.reports.render import FORMATS, render
from slurmtel.sources import SOURCES, get_source
from slurmtel.sources.base import RunContext, utc_now
from slurmtel.sources.runner import run_recorded
from slurmtel.timeparse import parse_slurm_time

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3

log = logging.getLogger("slurmtel")

Handler = Callable[[argparse.Namespace, Config], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"slurmtel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=args.log_level or config.logging.level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.handler(args, config))
    except ConfigError as exc:
        print(f"slurmtel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SlurmtelError as exc:
        print(f"slurmtel: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmtel", description="Slurm accounting and GPU telemetry in PostgreSQL."
    )
    parser.add_argument("--version", action="version", version=f"slurmtel {__version__}")
    parser.add_argument(
        "--config", default=None,
        help="config file (default: $SLURMTEL_CONFIG, else /etc/slurmtel/slurmtel.toml if present)",
    )
    parser.add_argument(
        "--log-level", default=None, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="override logging.level",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    collect = commands.add_parser("collect", help="run one source once, or ingest a saved capture")
    collect_sources = collect.add_subparsers(title="sources", metavar="SOURCE", required=True)
    for source in SOURCES.values():
        sp = collect_sources.add_parser(source.name, help=source.description)
        mode = sp.add_mutually_exclusive_group(required=True)
        mode.add_argument("--once", action="store_true", help="one collection cycle, as the daemon runs it")
        mode.add_argument("--input", type=Path, metavar="FILE", help="ingest a saved capture instead")
        source.add_arguments(sp)
        sp.set_defaults(handler=cmd_collect, source=source.name)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(title="actions", metavar="ACTION", required=True)
    db_commands.add_parser("upgrade", help="apply the Alembic migrations").set_defaults(handler=cmd_db_upgrade)
    db_commands.add_parser("current", help="show the schema revision").set_defaults(handler=cmd_db_current)

    report = commands.add_parser("report", help="reports")
    reports = report.add_subparsers(title="reports", metavar="REPORT", required=True)
    usage = reports.add_parser("usage", help="GPU-hours, outcomes and queue wait by account, user or partition")
    add_window_arguments(usage)
    add_filter_arguments(usage)
    usage.add_argument("--by", choices=("account", "user", "partition"), default="account")
    add_format_argument(usage)
    usage.set_defaults(handler=cmd_report_usage)

    quarantine = commands.add_parser("quarantine", help="records that could not be ingested")
    q_commands = quarantine.add_subparsers(title="actions", metavar="ACTION", required=True)
    q_list = q_commands.add_parser("list", help="list quarantined records with their reason")
    q_list.add_argument("--source", default=None, help="only this source")
    q_list.add_argument("--limit", type=int, default=100)
    q_list.add_argument("--raw", action="store_true", help="include the raw record text")
    add_format_argument(q_list)
    q_list.set_defaults(handler=cmd_quarantine_list)

    runs = commands.add_parser("runs", help="recent collect runs with their status")
    runs.add_argument("--source", default=None)
    runs.add_argument("--limit", type=int, default=20)
    add_format_argument(runs)
    runs.set_defaults(handler=cmd_runs)

    demo = commands.add_parser(
        "demo", help="ingest the bundled real Slurm capture into the embedded database and show a report"
    )
    demo.set_defaults(handler=cmd_demo)
    return parser


# ---------------------------------------------------------------- shared arguments


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-S", "--starttime", dest="start", default=None,
        help="window start in site.timezone (sacct forms; default: the 1st of this month)",
    )
    parser.add_argument("-E", "--endtime", dest="end", default=None, help="window end (default: now)")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-A", "--accounts", default=None, help="comma-separated accounts")
    parser.add_argument("-u", "--user", dest="users", default=None, help="comma-separated users")
    parser.add_argument("-r", "--partition", dest="partitions", default=None, help="comma-separated partitions")
    parser.add_argument("-M", "--clusters", default=None, help="comma-separated clusters")


def add_format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")


def split_list(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def resolve_window(args: argparse.Namespace, config: Config, now: datetime) -> tuple[datetime, datetime]:
    zone = config.zone
    try:
        if args.start:
            start = parse_slurm_time(args.start, now=now, zone=zone)
        else:
            local = now.astimezone(zone)
            start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).astimezone(now.tzinfo)
        end = parse_slurm_time(args.end, now=now, zone=zone) if args.end else now
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if end <= start:
        raise ConfigError(f"empty window: -E {end.isoformat()} is not after -S {start.isoformat()}")
    return start, end


# ---------------------------------------------------------------- identity


def current_identity(config: Config) -> Identity:
    """The caller, from the unix account running the CLI (DESIGN §8)."""
    uid = os.getuid()
    user = pwd.getpwuid(uid).pw_name
    if uid == 0 or user in config.access.admins:
        return Identity(user, Role.ADMIN)
    if user in config.access.finance:
        return Identity(user, Role.FINANCE)
    if config.database_url() is None:
        # the embedded database belongs to whoever runs it
        return Identity(user, Role.ADMIN)
    return Identity(user, Role.USER)


def scope_for(config: Config, action: Action) -> Scope:
    scope = allowed(current_identity(config), action)
    if scope.is_empty:
        raise SlurmtelError(f"not allowed: {action.value}")
    return scope


# ---------------------------------------------------------------- commands


def open_context(config: Config) -> RunContext:
    from slurmtel.store.engine import make_engine, require_schema

    engine = make_engine(config)
    require_schema(engine)
    return RunContext(config=config, engine=engine, clock=utc_now)


def cmd_collect(args: argparse.Namespace, config: Config) -> int:
    source = get_source(args.source)
    ctx = open_context(config)
    if args.input is not None:
        path = args.input
        outcome = run_recorded(ctx, source.name, "input", lambda: source.ingest(ctx, path, args))
    else:
        outcome = run_recorded(ctx, source.name, "once", lambda: source.collect(ctx, args))
    for note in outcome.result.notes:
        print(note)
    if outcome.status == "error":
        print(f"slurmtel: {source.name}: {outcome.error_kind}: {outcome.message}", file=sys.stderr)
        return EXIT_ERROR
    if outcome.status == "partial":
        print(f"slurmtel: {source.name}: {outcome.message} (see `slurmtel quarantine list`)", file=sys.stderr)
        return EXIT_PARTIAL
    return EXIT_OK


def cmd_db_upgrade(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import check_connection, make_engine
    from slurmtel.store.migrate import current_revision, upgrade

    engine = make_engine(config)
    check_connection(engine)
    before = current_revision(engine)
    upgrade(engine)
    after = current_revision(engine)
    print(f"schema at {after}" + (f" (was {before})" if before != after else " (already current)"))
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import check_connection, make_engine
    from slurmtel.store.migrate import current_revision, head_revision

    engine = make_engine(config)
    check_connection(engine)
    current, head = current_revision(engine), head_revision()
    print(f"current: {current or '(none)'}  head: {head}")
    return EXIT_OK if current == head else EXIT_ERROR


def cmd_report_usage(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.usage import JobFilter, usage_report

    scope = scope_for(config, Action.VIEW_AGGREGATES)
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    job_filter = JobFilter(
        accounts=split_list(args.accounts),
        users=split_list(args.users),
        partitions=split_list(args.partitions),
        clusters=split_list(args.clusters),
    )
    with ctx.engine.connect() as conn:
        rows = usage_report(
            conn, start=start, end=end, now=now, by=args.by, scope=scope, job_filter=job_filter
        )
    title = f"GPU usage by {args.by}, {start.isoformat()} .. {end.isoformat()}"
    render(rows, sys.stdout, args.format, columns=usage_columns(args.by, args.format), title=title)
    return EXIT_OK


def usage_columns(by: str, fmt: str) -> list[str] | None:
    """The table view leaves out the zero-heavy per-class columns that CSV/JSON keep."""
    if fmt != "table":
        return None
    return [
        "cluster", by, "jobs", "attempts", "requeues", "allocated_gpu_hours", "failed_gpu_seconds",
        "gpu_seconds_completed", "gpu_seconds_running", "queue_wait_count",
        "queue_wait_p50_seconds", "queue_wait_p95_seconds", "queue_wait_max_seconds",
    ]


def cmd_quarantine_list(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.quarantine import list_quarantine

    scope_for(config, Action.VIEW_OPERATIONS)
    ctx = open_context(config)
    with ctx.engine.connect() as conn:
        records = list_quarantine(conn, source=args.source, limit=args.limit)
    rows = [
        {
            "id": r.id,
            "source": r.source,
            "origin": r.origin,
            "record": r.record_key,
            "reason": r.reason,
            "seen": r.seen_count,
            "last_seen_at": r.last_seen_at,
            **({"raw": r.raw} if args.raw else {}),
        }
        for r in records
    ]
    render(rows, sys.stdout, args.format, title="Quarantined records")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.runs import recent_runs

    scope_for(config, Action.VIEW_OPERATIONS)
    ctx = open_context(config)
    with ctx.engine.connect() as conn:
        runs = recent_runs(conn, source=args.source, limit=args.limit)
    rows = [
        {
            "id": r.id, "source": r.source, "mode": r.mode, "started_at": r.started_at,
            "seconds": round((r.finished_at - r.started_at).total_seconds(), 3) if r.finished_at else None,
            "status": r.status, "error_kind": r.error_kind, "rows_read": r.rows_read,
            "rows_written": r.rows_written, "rows_quarantined": r.rows_quarantined, "message": r.message,
        }
        for r in runs
    ]
    render(rows, sys.stdout, args.format, title="Collect runs")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.demo import run_demo

    return run_demo(config, sys.stdout)

