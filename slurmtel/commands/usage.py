"""`slurmtel report usage`: GPU-hours, outcomes and queue wait by account, user or partition."""

from __future__ import annotations

import argparse
import sys

from slurmtel.access import Action
from slurmtel.commands.common import (
    EXIT_OK,
    add_filter_arguments,
    add_format_argument,
    add_window_arguments,
    job_filter,
    open_context,
    resolve_window,
    scope_for,
    warn_unknown,
)
from slurmtel.config import Config
from slurmtel.reports.render import render
from slurmtel.store.usage import usage_report

TABLE_COLUMNS = (
    "jobs",
    "attempts",
    "requeues",
    "allocated_gpu_hours",
    "failed_gpu_seconds",
    "gpu_seconds_completed",
    "gpu_seconds_running",
    "queue_wait_count",
    "queue_wait_p50_seconds",
    "queue_wait_p95_seconds",
    "queue_wait_max_seconds",
)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    usage = reports.add_parser(
        "usage", help="GPU-hours, outcomes and queue wait by account, user or partition"
    )
    add_window_arguments(usage)
    add_filter_arguments(usage)
    usage.add_argument("--by", choices=("account", "user", "partition"), default="account")
    add_format_argument(usage)
    usage.set_defaults(handler=cmd_report_usage)


def cmd_report_usage(args: argparse.Namespace, config: Config) -> int:
    scope = scope_for(config, Action.VIEW_AGGREGATES)
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    wanted = job_filter(args)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, wanted)
        rows = usage_report(conn, start=start, end=end, now=now, by=args.by, scope=scope, job_filter=wanted)
    # the table leaves out the zero-heavy per-class columns that CSV and JSON keep
    columns = ["cluster", args.by, *TABLE_COLUMNS] if args.format == "table" else None
    title = f"GPU usage by {args.by}, {start.isoformat()} .. {end.isoformat()}"
    render(rows, sys.stdout, args.format, columns=columns, title=title)
    return EXIT_OK
