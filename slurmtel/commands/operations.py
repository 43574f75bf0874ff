"""`slurmtel quarantine list`, `slurmtel runs`: what went wrong and what ran."""

from __future__ import annotations

import argparse
import sys

from slurmtel.access import Action
from slurmtel.commands.argtypes import positive_int
from slurmtel.commands.common import EXIT_OK, add_format_argument, open_context, scope_for, warn_unknown
from slurmtel.config import Config
from slurmtel.reports.render import render

# the columns of `quarantine list` (raw only with --raw) and `runs` (slurmtel.columns)
QUARANTINE_COLUMNS = ("quarantine_id", "source", "origin", "record", "reason", "seen", "last_seen_at", "raw")
RUNS_COLUMNS = (
    "run_id",
    "source",
    "mode",
    "started_at",
    "duration_seconds",
    "status",
    "error_kind",
    "rows_read",
    "rows_written",
    "rows_quarantined",
    "message",
)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    quarantine = commands.add_parser("quarantine", help="records that could not be ingested")
    actions = quarantine.add_subparsers(title="actions", metavar="ACTION", required=True)
    q_list = actions.add_parser("list", help="list quarantined records with their reason")
    q_list.add_argument("--source", default=None, help="only this source")
    q_list.add_argument("--limit", type=positive_int, default=100, help="at most this many (default 100)")
    q_list.add_argument("--raw", action="store_true", help="include the raw record text")
    add_format_argument(q_list)
    q_list.set_defaults(handler=cmd_quarantine_list)

    attribute = commands.add_parser(
        "attribute", help="fold new telemetry into the per job x GPU rollups (what the daemon runs)"
    )
    attribute.add_argument(
        "--full", action="store_true", help="recompute every attempt, not only what changed"
    )
    attribute.set_defaults(handler=cmd_attribute)

    runs = commands.add_parser("runs", help="recent collect runs with their status")
    runs.add_argument("--source", default=None)
    runs.add_argument("--limit", type=positive_int, default=20, help="at most this many (default 20)")
    add_format_argument(runs)
    runs.set_defaults(handler=cmd_runs)


def cmd_quarantine_list(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.quarantine import list_quarantine

    scope = scope_for(config, Action.VIEW_OPERATIONS)
    ctx = open_context(config)
    with ctx.engine.connect() as conn:
        if args.source is not None:
            warn_unknown(conn, scope, sources=[args.source])
        records = list_quarantine(conn, source=args.source, limit=args.limit)
    rows = [
        {
            "quarantine_id": r.id,
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
    columns = QUARANTINE_COLUMNS if args.raw else QUARANTINE_COLUMNS[:-1]
    render(rows, sys.stdout, args.format, columns=columns, title="Quarantined records")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.runs import recent_runs

    scope = scope_for(config, Action.VIEW_OPERATIONS)
    ctx = open_context(config)
    with ctx.engine.connect() as conn:
        if args.source is not None:
            warn_unknown(conn, scope, sources=[args.source])
        runs = recent_runs(conn, source=args.source, limit=args.limit)
    rows = [
        {
            "run_id": r.id,
            "source": r.source,
            "mode": r.mode,
            "started_at": r.started_at,
            "duration_seconds": round((r.finished_at - r.started_at).total_seconds(), 3)
            if r.finished_at
            else None,
            "status": r.status,
            "error_kind": r.error_kind,
            "rows_read": r.rows_read,
            "rows_written": r.rows_written,
            "rows_quarantined": r.rows_quarantined,
            "message": r.message,
        }
        for r in runs
    ]
    render(rows, sys.stdout, args.format, columns=RUNS_COLUMNS, title="Collect runs")
    return EXIT_OK


def cmd_attribute(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.attribution import run_attribution

    scope_for(config, Action.VIEW_OPERATIONS)
    ctx = open_context(config)
    result = run_attribution(ctx.engine, config, now=ctx.clock(), full=args.full)
    print(
        f"{result.attempts} attempts recomputed, {result.rows} attempt x GPU x day rows, "
        f"{result.batches} telemetry batches folded in, {result.retry_links} resubmission links"
    )
    return EXIT_OK
