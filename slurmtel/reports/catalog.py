"""Every windowed report, declared once: `slurmtel report NAME` and the API's `/v1/reports/NAME`
are both made from REPORTS.

Each spec names its access action, its options, its sections (typed rows, titles, the columns a
terminal table shows) and the store function holding its SQL (slurmtel/store/reports_*.py,
store/usage.py). Who may run which (slurmtel.access decides; deny by default):
- usage, failures, idle, queue, retries: VIEW_AGGREGATES. Rows are limited to the caller's scope
  (own jobs; a coordinator's accounts; everything for admins and finance). Sections that list
  single jobs (top attempts, top idle jobs, retry chains) use the VIEW_JOBS scope, so finance
  gets them empty.
- taxonomy, nodes, capacity: VIEW_OPERATIONS (cluster-wide: capacity and nodes are nobody's own
  data). They take -r and -M; -A/-u are refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slurmtel.access import Action
from slurmtel.errors import ConfigError
from slurmtel.filters import OUTCOME_CLASSES
from slurmtel.reports.spec import (
    Parameter,
    ReportQuery,
    ReportSpec,
    RowsBy,
    Section,
    StoreSections,
    row_type,
)

if TYPE_CHECKING:
    from slurmtel.store.sql import Connection


def top_title(rows: Sequence[Any], what: str, by: str) -> str:
    """The rows shown, not the --top asked for: "Top 2 attempts by failed GPU-hours"; "No
    attempts with failed GPU-hours" when there are none."""
    return f"Top {len(rows)} {what} by {by}" if rows else f"No {what} with {by}"


def _top(what: str, by: str) -> Any:
    return lambda query, rows: top_title(rows, what, by)


def _fixed(text: str) -> Any:
    return lambda query, rows: text


def by_group(
    report: str, figures: tuple[str, ...], groups: tuple[str, ...], what: str, first_title: Any
) -> tuple[Section, ...]:
    """The sections `by_<group>` of REPORT: cluster, the group column, then FIGURES; the first
    titled FIRST_TITLE (it names the window), the others "<WHAT> by <group>"."""
    return tuple(
        Section(
            f"by_{group}",
            row_type(f"{report}By{group.title()}Row", ("cluster", group, *figures)),
            first_title if i == 0 else _fixed(f"{what} by {group}"),
        )
        for i, group in enumerate(groups)
    )


TOP = Parameter("top", int, 10, "rows in the top list (default 10; 1 or more)", minimum=1)

# --- usage ------------------------------------------------------------------------------------

USAGE_GROUPS = ("account", "user", "partition")


def _usage_columns(group: str) -> tuple[str, ...]:
    return (
        "cluster",
        group,
        "jobs",
        "attempts",
        "requeues",
        "allocated_gpu_seconds",
        "allocated_gpu_hours",
        *(f"gpu_seconds_{c}" for c in OUTCOME_CLASSES),
        "failed_gpu_seconds",
        "queue_wait_count",
        "queue_wait_p50_seconds",
        "queue_wait_p95_seconds",
        "queue_wait_max_seconds",
    )


USAGE_ROWS = {g: row_type(f"UsageBy{g.title()}Row", _usage_columns(g)) for g in USAGE_GROUPS}
# the table leaves out the zero-heavy per-class columns that CSV and JSON keep
USAGE_TABLE_COLUMNS = (
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


# `report usage --tres LIST`: allocated TRES-seconds of every TRES Slurm accounts, per month
# (DESIGN §4 TRES usage; equal to sreport -T ALL -t seconds per account and user)
TRES_SUFFIX = "+tres"
TRES_ROWS = {
    g + TRES_SUFFIX: row_type(
        f"TresUsageBy{g.title()}Row", ("cluster", "month", g, "tres", "allocated_tres_seconds")
    )
    for g in USAGE_GROUPS
}


def tres_list(q: ReportQuery) -> tuple[str, ...] | None:
    """--tres as TRES names (() for all), None when not asked; ConfigError for a bad name."""
    text = q.option("tres").strip()
    if not text:
        return None
    if text == "all":
        return ()
    names = tuple(sorted({name.strip() for name in text.split(",") if name.strip()}))
    for name in names:
        if not re.fullmatch(r"[a-z]+(/[A-Za-z0-9_.:-]+)?", name):
            raise ConfigError(f"--tres: '{name}' is not a TRES name (cpu, mem, node, billing, gres/gpu, ...)")
        if name == "energy":
            raise ConfigError(
                "--tres energy: energy is consumed, not allocated: it has no TRES-seconds "
                "(a job's energy is in `slurmtel job`)"
            )
    return names


def _usage_rows_key(q: ReportQuery) -> str:
    return q.option("by") + (TRES_SUFFIX if tres_list(q) is not None else "")


def _usage_title(q: ReportQuery, rows: Sequence[Any]) -> str:
    if tres_list(q) is not None:
        return f"TRES usage (allocated TRES-seconds) by {q.option('by')} and month, {q.window_text()}"
    return f"GPU usage by {q.option('by')}, {q.window_text()}"


def _usage_table(q: ReportQuery) -> tuple[str, ...]:
    if tres_list(q) is not None:
        return ("cluster", "month", q.option("by"), "tres", "allocated_tres_seconds")
    return ("cluster", q.option("by"), *USAGE_TABLE_COLUMNS)


def _run_usage(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.usage import tres_usage_report, usage_report

    by = q.option("by")
    tres = tres_list(q)
    if tres is not None:
        rows = tres_usage_report(
            conn,
            start=q.start,
            end=q.end,
            now=q.now,
            by=by,
            scope=q.scope,
            zone=q.zone,
            tres=tres,
            job_filter=q.job_filter,
        )
        return {"usage": rows}
    rows = usage_report(
        conn, start=q.start, end=q.end, now=q.now, by=by, scope=q.scope, job_filter=q.job_filter
    )
    return {"usage": rows}


USAGE = ReportSpec(
    name="usage",
    help="GPU-hours, outcomes and queue wait by account, user or partition (--tres: every TRES)",
    action=Action.VIEW_AGGREGATES,
    parameters=(
        Parameter("by", str, "account", "group rows by", choices=USAGE_GROUPS),
        Parameter(
            "tres",
            str,
            "",
            "instead: allocated TRES-seconds per month of these TRES (cpu,mem,node,billing,gres/gpu,...) "
            "or 'all'",
        ),
    ),
    sections=(
        Section(
            "usage",
            row=RowsBy("by", {**USAGE_ROWS, **TRES_ROWS}, key=_usage_rows_key),
            title=_usage_title,
            table_columns=_usage_table,
        ),
    ),
    run=_run_usage,
    single=True,
)

# --- failures ---------------------------------------------------------------------------------

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
FAILED_ATTEMPT_COLUMNS = (
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
)


def _run_failures(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_failures import failures_report

    return failures_report(
        conn,
        start=q.start,
        end=q.end,
        now=q.now,
        scope=q.scope,
        job_scope=q.job_scope,
        job_filter=q.job_filter,
        top=q.option("top"),
        resubmission_window_seconds=q.resubmission_window_seconds,
    )


FAILURES = ReportSpec(
    name="failures",
    help="failed GPU-hours by outcome, account, user, partition, node",
    action=Action.VIEW_AGGREGATES,
    parameters=(TOP,),
    sections=(
        *by_group(
            "Failures",
            FAILURE_GROUP,
            ("account", "user", "partition"),
            "Failed GPU-hours",
            lambda q, rows: f"Failed GPU-hours by account, {q.window_text()}",
        ),
        Section(
            "by_node",
            row_type("FailuresByNodeRow", ("cluster", "node", *FAILURE_GROUP)),
            _fixed("Failed GPU-hours by node (multi-node attempts split evenly)"),
        ),
        Section(
            "top_attempts",
            row_type("FailedAttemptRow", FAILED_ATTEMPT_COLUMNS),
            _top("attempts", "failed GPU-hours"),
        ),
    ),
    run=_run_failures,
)

# --- idle -------------------------------------------------------------------------------------

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
IDLE_JOB_COLUMNS = (
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
)


def _run_idle(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_idle import idle_report

    first_day, last_day = q.days()
    return idle_report(
        conn,
        first_day=first_day,
        last_day=last_day,
        scope=q.scope,
        job_scope=q.job_scope,
        job_filter=q.job_filter,
        top=q.option("top"),
    )


IDLE = ReportSpec(
    name="idle",
    help="idle, no-process, busy and unmeasured GPU-hours (whole site days)",
    action=Action.VIEW_AGGREGATES,
    parameters=(TOP,),
    sections=(
        *by_group(
            "Idle",
            IDLE_GROUP,
            ("account", "user", "partition"),
            "Idle GPU-hours",
            lambda q, rows: f"Idle GPU-hours by account, {q.days_text()}",
        ),
        Section("top_jobs", row_type("IdleJobRow", IDLE_JOB_COLUMNS), _top("jobs", "idle GPU-hours")),
        Section(
            "unmapped",
            row_type(
                "UnmappedRow",
                ("cluster", "account", "unmapped_gpu_hours", "allocated_gpu_hours", "unmapped_share"),
            ),
            _fixed("Allocated GPU-hours no GPU could be mapped to, by account"),
        ),
    ),
    run=_run_idle,
)

# --- queue ------------------------------------------------------------------------------------

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


def _run_queue(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_queue import queue_report

    return queue_report(conn, start=q.start, end=q.end, now=q.now, scope=q.scope, job_filter=q.job_filter)


QUEUE = ReportSpec(
    name="queue",
    help="queue wait by partition and account; pending jobs now by reason",
    action=Action.VIEW_AGGREGATES,
    sections=(
        Section(
            "wait_by_partition",
            row_type("WaitByPartitionRow", ("cluster", "partition", *WAIT)),
            lambda q, rows: f"Queue wait (start - eligible) by partition, {q.window_text()}",
        ),
        Section(
            "wait_by_account",
            row_type("WaitByAccountRow", ("cluster", "account", *WAIT)),
            _fixed("Queue wait by account"),
        ),
        Section(
            "pending",
            row_type("PendingRow", ("cluster", "partition", *PENDING)),
            _fixed("Pending now, by partition and reason"),
        ),
        Section(
            "quota",
            row_type("QuotaPendingRow", ("cluster", "account", "partition", *PENDING)),
            _fixed("Pending now, refused by quota (AssocGrp*/AssocMax*/QOSGrp*/QOSMax*)"),
        ),
    ),
    run=_run_queue,
)

# --- taxonomy and capacity --------------------------------------------------------------------

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


def _run_taxonomy(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_taxonomy import taxonomy_report

    first_day, last_day = q.days()
    rows = taxonomy_report(
        conn,
        first_day=first_day,
        last_day=last_day,
        now=q.now,
        timezone=q.zone.key,
        scope=q.scope,
        job_filter=q.job_filter,
        poll_interval_seconds=q.poll_interval_seconds,
    )
    return {"taxonomy": rows}


TAXONOMY = ReportSpec(
    name="taxonomy",
    help="every installed GPU-hour per day and partition, by category",
    action=Action.VIEW_OPERATIONS,
    sections=(
        Section(
            "taxonomy",
            row_type("TaxonomyRow", TAXONOMY_COLUMNS),
            lambda q, rows: f"GPU-hour taxonomy, {q.days_text()}",
            TAXONOMY_TABLE_COLUMNS,
        ),
    ),
    run=_run_taxonomy,
    account_user_filters=False,
    single=True,
)

CAPACITY_SUMMARY_COLUMNS = (
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
)


def _run_capacity(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_taxonomy import capacity_report

    first_day, last_day = q.days()
    return capacity_report(
        conn,
        first_day=first_day,
        last_day=last_day,
        now=q.now,
        timezone=q.zone.key,
        scope=q.scope,
        job_filter=q.job_filter,
        target_gpu_hours=q.option("target_gpu_hours"),
        poll_interval_seconds=q.poll_interval_seconds,
        resubmission_window_seconds=q.resubmission_window_seconds,
    )


CAPACITY = ReportSpec(
    name="capacity",
    help="useful share of GPU-hours and the GPUs a target needs",
    action=Action.VIEW_OPERATIONS,
    parameters=(
        Parameter(
            "target_gpu_hours",
            float,
            None,
            "useful GPU-hours per month the site must deliver: prints required_gpus",
            minimum=0,
        ),
    ),
    sections=(
        Section(
            "summary",
            row_type("CapacitySummaryRow", CAPACITY_SUMMARY_COLUMNS),
            lambda q, rows: f"Capacity, {q.days_text()}",
        ),
        Section(
            "breakdown",
            row_type("CapacityBreakdownRow", ("cluster", "category", "gpu_hours", "share")),
            _fixed("Where the installed GPU-hours went (the categories add up to installed)"),
        ),
    ),
    run=_run_capacity,
    account_user_filters=False,
)

# --- nodes ------------------------------------------------------------------------------------

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


def _run_nodes(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_nodes import nodes_report

    return {
        "nodes": nodes_report(
            conn, start=q.start, end=q.end, now=q.now, scope=q.scope, job_filter=q.job_filter
        )
    }


NODES = ReportSpec(
    name="nodes",
    help="per node: failed attempts, NODE_FAIL, XID/ECC events, driver drift",
    action=Action.VIEW_OPERATIONS,
    sections=(
        Section("nodes", row_type("NodeRow", NODES_COLUMNS), lambda q, rows: f"Nodes, {q.window_text()}"),
    ),
    run=_run_nodes,
    account_user_filters=False,
    single=True,
)

# --- retries ----------------------------------------------------------------------------------

RETRY_GROUP = ("jobs", "requeues", "resubmissions", "chains", "retry_gpu_hours", "failed_gpu_hours")
CHAIN_COLUMNS = (
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
)


def _run_retries(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_retries import retries_report

    return retries_report(
        conn,
        start=q.start,
        end=q.end,
        now=q.now,
        scope=q.scope,
        job_scope=q.job_scope,
        job_filter=q.job_filter,
        resubmission_window_seconds=q.resubmission_window_seconds,
    )


RETRIES = ReportSpec(
    name="retries",
    help="requeues, resubmission chains and retry GPU-hours",
    action=Action.VIEW_AGGREGATES,
    sections=(
        Section(
            "chains",
            row_type("RetryChainRow", CHAIN_COLUMNS),
            lambda q, rows: f"Resubmission chains, {q.window_text()}",
        ),
        *by_group("Retries", RETRY_GROUP, ("account", "user"), "Retries", _fixed("Retries by account")),
    ),
    run=_run_retries,
)

# the registry: the CLI registers `report NAME` for each, the API serves `/v1/reports/NAME`
REPORTS: dict[str, ReportSpec] = {
    spec.name: spec for spec in (USAGE, FAILURES, IDLE, QUEUE, TAXONOMY, NODES, CAPACITY, RETRIES)
}
