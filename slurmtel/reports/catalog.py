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
    RowShape,
    Section,
    StoreSections,
)

if TYPE_CHECKING:
    from slurmtel.store.sql import Connection


def top_title(rows: Sequence[Any], what: str, by: str) -> str:
    """The rows shown, not the --top asked for: "Top 2 attempts by failed GPU-hours"; "No
    attempts with failed GPU-hours" when there are none."""
    return f"Top {len(rows)} {what} by {by}" if rows else f"No {what} with {by}"


def _top(what: str, by: str) -> Any:
    return lambda query, rows: top_title(rows, what, by)


def whose(query: ReportQuery) -> str:
    """What the rows of an aggregate report cover for the caller, said in its first title:
    nothing for a scope over everything; "your own jobs" for a user; a coordinator's accounts
    whole, and their own jobs elsewhere."""
    scope = query.scope
    if scope.everything:
        return ""
    if scope.accounts:
        accounts = ", ".join(sorted(scope.accounts))
        return f" (all jobs of {accounts}; elsewhere your own jobs only)"
    return " (your own jobs only)"


def _fixed(text: str) -> Any:
    return lambda query, rows: text


def by_group(
    report: str,
    figures: tuple[str, ...],
    groups: tuple[str, ...],
    what: str,
    first_title: Any,
    key_figures: tuple[str, ...] = (),
) -> tuple[Section, ...]:
    """The sections `by_<group>` of REPORT: cluster, the group column, then FIGURES; the first
    titled FIRST_TITLE (it names the window), the others "<WHAT> by <group>". A narrow table
    keeps the group and KEY_FIGURES first."""
    return tuple(
        Section(
            f"by_{group}",
            RowShape(f"{report}By{group.title()}Row", ("cluster", group, *figures)),
            first_title if i == 0 else _fixed(f"{what} by {group}"),
            key_columns=(group, *key_figures),
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
        *(f"{c}_gpu_seconds" for c in OUTCOME_CLASSES),
        "failed_gpu_seconds",
        "queue_wait_count",
        "queue_wait_p50_seconds",
        "queue_wait_p95_seconds",
        "queue_wait_max_seconds",
    )


# what a narrow table keeps: GPU time, failed GPU time, the queue wait
USAGE_KEY_FIGURES = (
    "allocated_gpu_seconds",
    "failed_gpu_seconds",
    "queue_wait_p50_seconds",
    "queue_wait_p95_seconds",
)
USAGE_ROWS = {g: RowShape(f"UsageBy{g.title()}Row", _usage_columns(g)) for g in USAGE_GROUPS}
# the table leaves out the zero-heavy per-class columns that CSV and JSON keep
USAGE_TABLE_COLUMNS = (
    "jobs",
    "attempts",
    "requeues",
    "allocated_gpu_seconds",
    "failed_gpu_seconds",
    "completed_gpu_seconds",
    "running_gpu_seconds",
    "queue_wait_count",
    "queue_wait_p50_seconds",
    "queue_wait_p95_seconds",
    "queue_wait_max_seconds",
)


# `report usage --tres LIST`: allocated TRES-seconds of every TRES Slurm accounts, per month
# (DESIGN §4 TRES usage; equal to sreport -T ALL -t seconds per account and user)
TRES_SUFFIX = "+tres"
TRES_ROWS = {
    g + TRES_SUFFIX: RowShape(
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
        return (
            f"TRES usage (allocated TRES-seconds) by {q.option('by')} and month{whose(q)}, {q.window_text()}"
        )
    return f"GPU usage by {q.option('by')}{whose(q)}, {q.window_text()}"


def _usage_keys(q: ReportQuery) -> tuple[str, ...]:
    if tres_list(q) is not None:
        return (q.option("by"), "tres", "allocated_tres_seconds", "month")
    return (q.option("by"), *USAGE_KEY_FIGURES)


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
            key_columns=_usage_keys,
        ),
    ),
    run=_run_usage,
    single=True,
)

# --- failures ---------------------------------------------------------------------------------

FAILURE_GROUP = (
    "failed_attempts",
    "failed_gpu_seconds",
    "user_failure_gpu_seconds",
    "system_failure_gpu_seconds",
    "cancelled_gpu_seconds",
    "preempted_gpu_seconds",
    "allocated_gpu_seconds",
    "failed_share",
    "retry_gpu_seconds",
)
FAILURE_KEY_FIGURES = ("failed_gpu_seconds", "failed_share", "failed_attempts")
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
    "failed_gpu_seconds",
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
            lambda q, rows: f"Failed GPU-hours by account{whose(q)}, {q.window_text()}",
            FAILURE_KEY_FIGURES,
        ),
        Section(
            "by_node",
            RowShape("FailuresByNodeRow", ("cluster", "node", *FAILURE_GROUP)),
            _fixed("Failed GPU-hours by node (multi-node attempts split evenly)"),
            key_columns=("node", *FAILURE_KEY_FIGURES),
        ),
        Section(
            "top_attempts",
            RowShape("FailedAttemptRow", FAILED_ATTEMPT_COLUMNS),
            _top("attempts", "failed GPU-hours"),
            key_columns=("job_id", "failed_gpu_seconds", "state", "gpus"),
        ),
    ),
    run=_run_failures,
)

# --- idle -------------------------------------------------------------------------------------

IDLE_GROUP = (
    "allocated_gpu_seconds",
    "covered_gpu_seconds",
    "busy_gpu_seconds",
    "idle_gpu_seconds",
    "no_process_gpu_seconds",
    "unmeasured_gpu_seconds",
    "idle_share",
    "covered_share",
    "mean_util_share",
)
# the idle share and GPU time, the no-process part, the mean utilisation
IDLE_KEY_FIGURES = ("idle_share", "idle_gpu_seconds", "no_process_gpu_seconds", "mean_util_share")
IDLE_JOB_COLUMNS = (
    "cluster",
    "job_id",
    "user",
    "account",
    "partition",
    "state",
    "gpus",
    "allocated_gpu_seconds",
    "idle_gpu_seconds",
    "no_process_gpu_seconds",
    "idle_share",
    "covered_share",
    "mean_util_share",
)


IDLE_CAUSE_GROUP = (
    "idle_gpu_seconds",
    "no_process_gpu_seconds",
    "idle_hardware_gpu_seconds",
    "idle_storage_wait_gpu_seconds",
    "idle_network_wait_gpu_seconds",
    "idle_cpu_bound_gpu_seconds",
    "idle_unexplained_gpu_seconds",
    "idle_unmeasured_gpu_seconds",
)
IDLE_BY = ("group", "cause")


def _run_idle(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_idle import idle_cause_rows, idle_report

    first_day, last_day = q.days()
    sections = dict(
        idle_report(
            conn,
            first_day=first_day,
            last_day=last_day,
            scope=q.scope,
            job_scope=q.job_scope,
            job_filter=q.job_filter,
            top=q.option("top"),
        )
    )
    causes = idle_cause_rows(
        conn, first_day=first_day, last_day=last_day, scope=q.scope, job_filter=q.job_filter
    )
    sections["by_cause"] = causes["by_cause"]
    if q.option("by") == "cause":
        for name in ("by_account", "by_user", "by_partition"):
            sections[name] = causes[name]
    return sections


def _idle_groups() -> tuple[Section, ...]:
    """by_account, by_user, by_partition: the idle figures, or with --by cause the idle GPU
    time split by cause."""
    sections = []
    for i, group in enumerate(("account", "user", "partition")):
        types = {
            "group": RowShape(f"IdleBy{group.title()}Row", ("cluster", group, *IDLE_GROUP)),
            "cause": RowShape(f"IdleCauseBy{group.title()}Row", ("cluster", group, *IDLE_CAUSE_GROUP)),
        }
        keys = {"group": (group, *IDLE_KEY_FIGURES), "cause": (group, *IDLE_CAUSE_GROUP)}
        sections.append(
            Section(
                f"by_{group}",
                RowsBy("by", types),
                (lambda q, rows: f"Idle GPU-hours by account{whose(q)}, {q.days_text()}")
                if i == 0
                else _fixed(f"Idle GPU-hours by {group}"),
                key_columns=lambda q, keys=keys: keys[q.option("by")],  # type: ignore[misc]
            )
        )
    return tuple(sections)


IDLE = ReportSpec(
    name="idle",
    help="idle, no-process, busy and unmeasured GPU-hours, and idle GPU-hours by cause (whole site days)",
    action=Action.VIEW_AGGREGATES,
    parameters=(
        TOP,
        Parameter(
            "by",
            str,
            "group",
            "group: idle, busy and unmeasured figures per group; cause: each group's idle GPU time split by "
            "cause (docs/idle-causes.md)",
            choices=IDLE_BY,
        ),
    ),
    sections=(
        *_idle_groups(),
        Section(
            "by_cause",
            RowShape("IdleCauseRow", ("cluster", "idle_cause", "idle_gpu_seconds", "idle_cause_share")),
            _fixed(
                "Idle GPU-hours by cause (docs/idle-causes.md: an estimate from host signals; a node's NFS "
                "and GPFS traffic counts only for a job alone on the node)"
            ),
            key_columns=("idle_cause", "idle_gpu_seconds", "idle_cause_share"),
        ),
        Section(
            "top_jobs",
            RowShape("IdleJobRow", IDLE_JOB_COLUMNS),
            _top("jobs", "idle GPU-hours"),
            key_columns=("job_id", *IDLE_KEY_FIGURES),
        ),
        Section(
            "unmapped",
            RowShape(
                "UnmappedRow",
                ("cluster", "account", "unmapped_gpu_seconds", "allocated_gpu_seconds", "unmapped_share"),
            ),
            _fixed("Allocated GPU-hours no GPU could be mapped to, by account"),
            key_columns=("account", "unmapped_gpu_seconds", "unmapped_share"),
        ),
    ),
    run=_run_idle,
)

# --- queue ------------------------------------------------------------------------------------

WAIT = (
    "queue_wait_count",
    "queue_wait_p50_seconds",
    "queue_wait_p95_seconds",
    "queue_wait_max_seconds",
    "queue_wait_mean_seconds",
)
WAIT_KEY_FIGURES = ("queue_wait_p50_seconds", "queue_wait_p95_seconds", "queue_wait_count")
PENDING_KEY_FIGURES = ("jobs", "gpus_requested", "oldest_pending_seconds")
PENDING = (
    "reason",
    "jobs",
    "users",
    "gpus_requested",
    "oldest_pending_seconds",
    "mean_pending_seconds",
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
            RowShape("WaitByPartitionRow", ("cluster", "partition", *WAIT)),
            lambda q, rows: f"Queue wait (start - eligible) by partition{whose(q)}, {q.window_text()}",
            key_columns=("partition", *WAIT_KEY_FIGURES),
        ),
        Section(
            "wait_by_account",
            RowShape("WaitByAccountRow", ("cluster", "account", *WAIT)),
            _fixed("Queue wait by account"),
            key_columns=("account", *WAIT_KEY_FIGURES),
        ),
        Section(
            "pending",
            RowShape("PendingRow", ("cluster", "partition", *PENDING)),
            _fixed("Pending now, by partition and reason"),
            key_columns=("partition", "reason", *PENDING_KEY_FIGURES),
        ),
        Section(
            "quota",
            RowShape("QuotaPendingRow", ("cluster", "account", "partition", *PENDING)),
            _fixed("Pending now, refused by quota (AssocGrp*/AssocMax*/QOSGrp*/QOSMax*)"),
            key_columns=("account", "reason", *PENDING_KEY_FIGURES),
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
    "installed_gpu_seconds",
    *(f"{p}_gpu_seconds" for p in TAXONOMY_PARTS),
    *(f"{p}_share" for p in TAXONOMY_PARTS),
    "capacity_unknown_gpu_seconds",
)
# a table: installed, where it went as shares of it (what a narrow table keeps), then the GPU time
TAXONOMY_KEY_SHARES = (
    "active_share",
    "allocated_idle_share",
    "allocated_no_process_share",
    "unallocated_share",
    "unmeasured_share",
    "unavailable_share",
)
TAXONOMY_TABLE_COLUMNS = (
    "day",
    "cluster",
    "partition",
    "installed_gpu_seconds",
    *TAXONOMY_KEY_SHARES,
    *(f"{p}_gpu_seconds" for p in TAXONOMY_PARTS),
    "capacity_unknown_gpu_seconds",
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
            RowShape("TaxonomyRow", TAXONOMY_COLUMNS),
            lambda q, rows: f"GPU-hour taxonomy, {q.days_text()}",
            TAXONOMY_TABLE_COLUMNS,
            key_columns=("day", "partition", *TAXONOMY_KEY_SHARES),
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
    "installed_gpu_seconds",
    "average_gpus_installed",
    "useful_gpu_seconds",
    "useful_share",
    "failed_gpu_seconds",
    "retry_gpu_seconds",
    "retry_share",
    "capacity_unknown_gpu_seconds",
    "useful_gpu_seconds_per_gpu_month",
    "gpus_installed_now",
    "gpus_available_now",
    "target_gpu_seconds_per_month",
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
            "useful GPU-hours per month the site must deliver: prints required_gpus "
            "(target_gpu_seconds_per_month in CSV/JSON)",
            minimum=0,
        ),
    ),
    sections=(
        Section(
            "summary",
            RowShape("CapacitySummaryRow", CAPACITY_SUMMARY_COLUMNS),
            lambda q, rows: f"Capacity, {q.days_text()}",
            key_columns=(
                "cluster",
                "useful_share",
                "useful_gpu_seconds_per_gpu_month",
                "required_gpus",
                "additional_gpus_needed",
            ),
        ),
        Section(
            "breakdown",
            RowShape(
                "CapacityBreakdownRow", ("cluster", "category", "category_gpu_seconds", "category_share")
            ),
            _fixed(
                "Where the installed GPU-hours went: the taxonomy's parts, active split by outcome "
                "(the categories add up to installed)"
            ),
            key_columns=("category", "category_gpu_seconds", "category_share"),
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
    "node_fail_attempts",
    "failed_gpu_seconds",
    "allocated_gpu_seconds",
    "xid_events",
    "xid_codes",
    "ecc_single_bit_errors",
    "ecc_double_bit_errors",
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
        Section(
            "nodes",
            RowShape("NodeRow", NODES_COLUMNS),
            lambda q, rows: f"Nodes, {q.window_text()}",
            key_columns=("node", "failed_attempts", "node_fail_attempts", "failed_gpu_seconds", "xid_events"),
        ),
    ),
    run=_run_nodes,
    account_user_filters=False,
    single=True,
)

# --- retries ----------------------------------------------------------------------------------

RETRY_GROUP = ("jobs", "requeues", "resubmissions", "chains", "retry_gpu_seconds", "failed_gpu_seconds")
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
    "retry_gpu_seconds",
    "failed_gpu_seconds",
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
            RowShape("RetryChainRow", CHAIN_COLUMNS),
            lambda q, rows: f"Resubmission chains{whose(q)}, {q.window_text()}",
            key_columns=("user", "job_ids", "retry_gpu_seconds", "failed_jobs"),
        ),
        *by_group(
            "Retries",
            RETRY_GROUP,
            ("account", "user"),
            "Retries",
            _fixed("Retries by account"),
            ("retry_gpu_seconds", "requeues", "resubmissions"),
        ),
    ),
    run=_run_retries,
)

# --- checkpoints ------------------------------------------------------------------------------

CHECKPOINT_GROUP = (
    "jobs",
    "checkpoint_episodes",
    "checkpoint_gpu_seconds",
    "checkpoint_write_bytes",
    "startup_gpu_seconds",
    "startup_read_bytes",
)


def _run_checkpoints(conn: Connection, q: ReportQuery) -> StoreSections:
    from slurmtel.store.reports_idle import checkpoint_report

    return checkpoint_report(conn, start=q.start, end=q.end, scope=q.scope, job_filter=q.job_filter)


CHECKPOINTS = ReportSpec(
    name="checkpoints",
    help="GPU-hours spent checkpointing and starting up (estimates from host signals) of jobs that ended",
    action=Action.VIEW_AGGREGATES,
    sections=by_group(
        "Checkpoints",
        CHECKPOINT_GROUP,
        ("account", "partition"),
        "Checkpoint and start-up GPU-hours",
        lambda q, rows: (
            f"Checkpoint and start-up GPU-hours (estimates) by account{whose(q)}, {q.window_text()}"
        ),
        ("checkpoint_gpu_seconds", "startup_gpu_seconds", "checkpoint_episodes"),
    ),
    run=_run_checkpoints,
)

# the registry: the CLI registers `report NAME` for each, the API serves `/v1/reports/NAME`
REPORTS: dict[str, ReportSpec] = {
    spec.name: spec
    for spec in (USAGE, FAILURES, IDLE, QUEUE, TAXONOMY, NODES, CAPACITY, RETRIES, CHECKPOINTS)
}
