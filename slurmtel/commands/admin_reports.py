"""Admin reports: `slurmtel report failures | idle | queue | taxonomy | nodes | capacity | retries`.

Who may run which (slurmtel.access decides; deny by default):
- failures, idle, queue, retries: VIEW_AGGREGATES. Rows are limited to the caller's scope (own
  jobs; a coordinator's accounts; everything for admins and finance). Sections that list single
  jobs (top attempts, top idle jobs, retry chains) use the VIEW_JOBS scope, so finance gets
  them empty.
- taxonomy, nodes, capacity: VIEW_OPERATIONS (cluster-wide: capacity and nodes are nobody's
  own data). They take -r and -M; -A/-u are refused.

Reports with several sections print each: a titled table each; JSON an object
{"section": [rows], ...}; CSV each section as a "# section" line, a header and rows, with a
blank line between sections.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from slurmtel.access import Action, Identity, Scope, allowed
from slurmtel.commands.argtypes import positive_int
from slurmtel.commands.common import (
    EXIT_OK,
    add_filter_arguments,
    add_format_argument,
    add_window_arguments,
    current_identity,
    job_filter,
    open_context,
    resolve_window,
    scope_for,
    warn_unknown,
)
from slurmtel.commands.sections import json_numbers, render_sections
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import render

FAILURE_GROUP = (
    "failed_attempts",
    "failed_gpu_hours",
    "user_failure_gpu_hours",
    "system_failure_gpu_hours",
    "cancelled_gpu_hours",
    "preempted_gpu_hours",
    "allocated_gpu_hours",
    "failed_share",
    "retry_gpu_hours",
)
FAILURES_COLUMNS = {
    "by_account": ("cluster", "account", *FAILURE_GROUP),
    "by_user": ("cluster", "user", *FAILURE_GROUP),
    "by_partition": ("cluster", "partition", *FAILURE_GROUP),
    "by_node": ("cluster", "node", *FAILURE_GROUP),
    "top_attempts": (
        "cluster",
        "job_id",
        "user",
        "account",
        "partition",
        "state",
        "outcome",
        "exit_code",
        "nodes",
        "gpus",
        "elapsed_seconds",
        "failed_gpu_hours",
        "retry",
    ),
}
IDLE_GROUP = (
    "allocated_gpu_hours",
    "covered_gpu_hours",
    "busy_gpu_hours",
    "idle_gpu_hours",
    "no_process_gpu_hours",
    "unmeasured_gpu_hours",
    "idle_share",
    "coverage",
    "mean_util_percent",
)
IDLE_COLUMNS = {
    "by_account": ("cluster", "account", *IDLE_GROUP),
    "by_user": ("cluster", "user", *IDLE_GROUP),
    "by_partition": ("cluster", "partition", *IDLE_GROUP),
    "top_jobs": (
        "cluster",
        "job_id",
        "user",
        "account",
        "partition",
        "state",
        "gpus",
        "allocated_gpu_hours",
        "idle_gpu_hours",
        "no_process_gpu_hours",
        "idle_share",
        "coverage",
        "mean_util_percent",
    ),
    "unmapped": ("cluster", "account", "unmapped_gpu_hours", "allocated_gpu_hours", "unmapped_share"),
}
WAIT = ("count", "p50_seconds", "p95_seconds", "max_seconds", "mean_seconds")
PENDING = (
    "reason",
    "jobs",
    "users",
    "gpus_requested",
    "oldest_wait_seconds",
    "mean_wait_seconds",
    "observed_at",
)
QUEUE_COLUMNS = {
    "wait_by_partition": ("cluster", "partition", *WAIT),
    "wait_by_account": ("cluster", "account", *WAIT),
    "pending": ("cluster", "partition", *PENDING),
    "quota": ("cluster", "account", "partition", *PENDING),
}
TAXONOMY_PARTS = (
    "unavailable",
    "unallocated",
    "allocated_no_process",
    "allocated_idle",
    "active",
    "unmeasured",
)
TAXONOMY_COLUMNS = (
    "day",
    "cluster",
    "partition",
    "installed_gpu_hours",
    *(f"{p}_gpu_hours" for p in TAXONOMY_PARTS),
    *(f"{p}_share" for p in TAXONOMY_PARTS),
    "capacity_unknown_gpu_hours",
)
TAXONOMY_TABLE_COLUMNS = (
    "day",
    "cluster",
    "partition",
    "installed_gpu_hours",
    *(f"{p}_gpu_hours" for p in TAXONOMY_PARTS),
    "active_share",
    "capacity_unknown_gpu_hours",
)
NODES_COLUMNS = (
    "cluster",
    "node",
    "state",
    "reason",
    "partitions",
    "attempts",
    "failed_attempts",
    "node_fail",
    "failed_gpu_hours",
    "allocated_gpu_hours",
    "xid_events",
    "xid_codes",
    "ecc_single_bit",
    "ecc_double_bit",
    "gpu_model",
    "gpus",
    "driver_version",
    "cuda_version",
    "driver_drift",
    "cuda_drift",
)
CAPACITY_COLUMNS = {
    "summary": (
        "cluster",
        "first_day",
        "last_day",
        "installed_gpu_hours",
        "average_gpus_installed",
        "useful_gpu_hours",
        "useful_share",
        "failed_gpu_hours",
        "retry_gpu_hours",
        "retry_share",
        "capacity_unknown_gpu_hours",
        "useful_work_per_gpu_month",
        "gpus_installed_now",
        "gpus_available_now",
        "target_gpu_hours_per_month",
        "required_gpus",
        "additional_gpus_needed",
    ),
    "breakdown": ("cluster", "category", "gpu_hours", "share"),
}
RETRY_GROUP = ("jobs", "requeues", "resubmissions", "chains", "retry_gpu_hours", "failed_gpu_hours")
RETRIES_COLUMNS = {
    "chains": (
        "cluster",
        "user",
        "account",
        "partition",
        "name",
        "jobs",
        "job_ids",
        "outcomes",
        "failed_jobs",
        "requeues",
        "resubmissions",
        "first_submit_at",
        "last_end_at",
        "retry_gpu_hours",
        "failed_gpu_hours",
    ),
    "by_account": ("cluster", "account", *RETRY_GROUP),
    "by_user": ("cluster", "user", *RETRY_GROUP),
}


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    failures = _report(reports, "failures", "failed GPU-hours by outcome, account, user, partition, node")
    failures.add_argument(
        "--top", type=positive_int, default=10, help="attempts in the top list (default 10; 1 or more)"
    )
    failures.set_defaults(handler=cmd_report_failures)

    idle = _report(reports, "idle", "idle, no-process, busy and unmeasured GPU-hours (whole site days)")
    idle.add_argument(
        "--top", type=positive_int, default=10, help="jobs in the top list (default 10; 1 or more)"
    )
    idle.set_defaults(handler=cmd_report_idle)

    queue = _report(reports, "queue", "queue wait by partition and account; pending jobs now by reason")
    queue.set_defaults(handler=cmd_report_queue)

    taxonomy = _report(reports, "taxonomy", "every installed GPU-hour per day and partition, by category")
    taxonomy.set_defaults(handler=cmd_report_taxonomy)

    nodes = _report(reports, "nodes", "per node: failed attempts, NODE_FAIL, XID/ECC events, driver drift")
    nodes.add_argument(
        "--drift",
        action="store_true",
        help="instead: the nodes that differ from the majority of their partition (driver, CUDA, "
        "VBIOS, GPU model, GPU memory, GPUs, topology), with since when",
    )
    nodes.set_defaults(handler=cmd_report_nodes)

    capacity = _report(reports, "capacity", "useful share of GPU-hours and the GPUs a target needs")
    capacity.add_argument(
        "--target-gpu-hours",
        type=float,
        default=None,
        metavar="N",
        help="useful GPU-hours per month the site must deliver: prints required_gpus",
    )
    capacity.set_defaults(handler=cmd_report_capacity)

    retries = _report(reports, "retries", "requeues, resubmission chains and retry GPU-hours")
    retries.set_defaults(handler=cmd_report_retries)


def _report(reports: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = reports.add_parser(name, help=help_text)
    add_window_arguments(parser)
    add_filter_arguments(parser)
    add_format_argument(parser)
    return parser


def top_title(rows: Sequence[Any], what: str, by: str) -> str:
    """The rows shown, not the --top asked for: "Top 2 attempts by failed GPU-hours"; "No
    attempts with failed GPU-hours" when there are none."""
    return f"Top {len(rows)} {what} by {by}" if rows else f"No {what} with {by}"


# ---------------------------------------------------------------- handlers


def cmd_report_failures(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_failures import failures_report

    scope, job_scope = _aggregate_scopes(config)
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        sections = failures_report(
            conn,
            start=start,
            end=end,
            now=now,
            scope=scope,
            job_scope=job_scope,
            job_filter=job_filter(args),
            top=args.top,
            resubmission_window_seconds=config.attribution.resubmission_window_seconds,
        )
    window = _window_text(start, end)
    titles = {
        "by_account": f"Failed GPU-hours by account, {window}",
        "by_user": "Failed GPU-hours by user",
        "by_partition": "Failed GPU-hours by partition",
        "by_node": "Failed GPU-hours by node (multi-node attempts split evenly)",
        "top_attempts": top_title(sections["top_attempts"], "attempts", "failed GPU-hours"),
    }
    render_sections(sections, sys.stdout, args.format, FAILURES_COLUMNS, titles)
    return EXIT_OK


def cmd_report_idle(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_admin import window_days
    from slurmtel.store.reports_idle import idle_report

    scope, job_scope = _aggregate_scopes(config)
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    first_day, last_day = window_days(start, end, config.zone)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        sections = idle_report(
            conn,
            first_day=first_day,
            last_day=last_day,
            scope=scope,
            job_scope=job_scope,
            job_filter=job_filter(args),
            top=args.top,
        )
    days = f"{first_day.isoformat()} .. {last_day.isoformat()} ({config.site.timezone} days)"
    titles = {
        "by_account": f"Idle GPU-hours by account, {days}",
        "by_user": "Idle GPU-hours by user",
        "by_partition": "Idle GPU-hours by partition",
        "top_jobs": top_title(sections["top_jobs"], "jobs", "idle GPU-hours"),
        "unmapped": "Allocated GPU-hours no GPU could be mapped to, by account",
    }
    render_sections(sections, sys.stdout, args.format, IDLE_COLUMNS, titles)
    return EXIT_OK


def cmd_report_queue(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_queue import queue_report

    scope = scope_for(config, Action.VIEW_AGGREGATES, current_identity(config))
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        sections = queue_report(conn, start=start, end=end, now=now, scope=scope, job_filter=job_filter(args))
    titles = {
        "wait_by_partition": f"Queue wait (start - eligible) by partition, {_window_text(start, end)}",
        "wait_by_account": "Queue wait by account",
        "pending": "Pending now, by partition and reason",
        "quota": "Pending now, refused by quota (AssocGrp*/AssocMax*/QOSGrp*/QOSMax*)",
    }
    render_sections(sections, sys.stdout, args.format, QUEUE_COLUMNS, titles)
    return EXIT_OK


def cmd_report_taxonomy(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_admin import window_days
    from slurmtel.store.reports_taxonomy import taxonomy_report

    _refuse_account_user(args, "taxonomy")
    scope = scope_for(config, Action.VIEW_OPERATIONS, current_identity(config))
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    first_day, last_day = window_days(start, end, config.zone)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        rows = taxonomy_report(
            conn,
            first_day=first_day,
            last_day=last_day,
            now=now,
            timezone=config.site.timezone,
            scope=scope,
            job_filter=job_filter(args),
            poll_interval_seconds=config.sources.slurmctld.interval_seconds,
        )
    columns = TAXONOMY_TABLE_COLUMNS if args.format == "table" else TAXONOMY_COLUMNS
    title = (
        f"GPU-hour taxonomy, {first_day.isoformat()} .. {last_day.isoformat()} ({config.site.timezone} days)"
    )
    _render(rows, sys.stdout, args.format, columns, title)
    return EXIT_OK


def cmd_report_nodes(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_nodes import nodes_report

    if args.drift:
        from slurmtel.commands.fabric import cmd_report_drift

        return cmd_report_drift(args, config)
    _refuse_account_user(args, "nodes")
    scope = scope_for(config, Action.VIEW_OPERATIONS, current_identity(config))
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        rows = nodes_report(conn, start=start, end=end, now=now, scope=scope, job_filter=job_filter(args))
    title = f"Nodes, {_window_text(start, end)}"
    _render(rows, sys.stdout, args.format, NODES_COLUMNS, title)
    return EXIT_OK


def cmd_report_capacity(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_admin import window_days
    from slurmtel.store.reports_taxonomy import capacity_report

    _refuse_account_user(args, "capacity")
    if args.target_gpu_hours is not None and not 0 <= args.target_gpu_hours < float("inf"):
        raise ConfigError(f"--target-gpu-hours must be a number 0 or more, not {args.target_gpu_hours}")
    scope = scope_for(config, Action.VIEW_OPERATIONS, current_identity(config))
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    first_day, last_day = window_days(start, end, config.zone)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        sections = capacity_report(
            conn,
            first_day=first_day,
            last_day=last_day,
            now=now,
            timezone=config.site.timezone,
            scope=scope,
            job_filter=job_filter(args),
            target_gpu_hours=args.target_gpu_hours,
            poll_interval_seconds=config.sources.slurmctld.interval_seconds,
            resubmission_window_seconds=config.attribution.resubmission_window_seconds,
        )
    days = f"{first_day.isoformat()} .. {last_day.isoformat()} ({config.site.timezone} days)"
    titles = {
        "summary": f"Capacity, {days}",
        "breakdown": "Where the installed GPU-hours went (the categories add up to installed)",
    }
    render_sections(sections, sys.stdout, args.format, CAPACITY_COLUMNS, titles)
    return EXIT_OK


def cmd_report_retries(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_retries import retries_report

    scope, job_scope = _aggregate_scopes(config)
    ctx = open_context(config)
    now = ctx.clock()
    start, end = resolve_window(args, config, now)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        sections = retries_report(
            conn,
            start=start,
            end=end,
            now=now,
            scope=scope,
            job_scope=job_scope,
            job_filter=job_filter(args),
            resubmission_window_seconds=config.attribution.resubmission_window_seconds,
        )
    window = _window_text(start, end)
    titles = {
        "chains": f"Resubmission chains, {window}",
        "by_account": "Retries by account",
        "by_user": "Retries by user",
    }
    render_sections(sections, sys.stdout, args.format, RETRIES_COLUMNS, titles)
    return EXIT_OK


# ---------------------------------------------------------------- helpers


def _aggregate_scopes(config: Config, identity: Identity | None = None) -> tuple[Scope, Scope]:
    """(scope for aggregates, scope for single-job detail) of the caller; denied without the first."""
    who = identity or current_identity(config)
    return scope_for(config, Action.VIEW_AGGREGATES, who), allowed(who, Action.VIEW_JOBS)


def _refuse_account_user(args: argparse.Namespace, report: str) -> None:
    if args.accounts or args.users:
        raise ConfigError(f"report {report} is per cluster and partition: -A/-u do not apply")


def _window_text(start: datetime, end: datetime) -> str:
    return f"{start.isoformat()} .. {end.isoformat()}"


def _render(
    rows: Sequence[Mapping[str, Any]], out: TextIO, fmt: str, columns: Sequence[str], title: str
) -> None:
    render(json_numbers(rows) if fmt == "json" else rows, out, fmt, columns=columns, title=title)
