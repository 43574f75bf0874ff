"""Every figure a message shows, declared once: its name in messages and evidence, the column
it is taken from (and where that column is computed), its unit and what it means.

A template may show a figure only through these names (`figures.<name>` for the job, node,
account or month; `gpu.<name>` for each GPU): tests/test_actions_templates.py reads every
shipped template and fails on a figure that is not declared here or not listed for that
template in TEMPLATE_FIGURES. Names carry their unit (`_seconds`, `_bytes`, `_percent`,
`_share` for a fraction, `_amount` for money in `currency`); counts are plain nouns (`gpus`).
Where the source column is a percentage of a ratio (`idle_percent`), the figure is the fraction
(`idle_share`, scale 0.01). Messages print them with the filters of slurmtel.actions.render
(the one place that turns seconds, bytes and shares into text).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

# where a column comes from
JOB_VIEW = "slurmtel job (slurmtel.reports.researcher.job_document)"
JOB_GPU_VIEW = "slurmtel job, per GPU (slurmtel.reports.researcher.gpu_row)"
STREAK = "idle stretches (action_gpu_streak, slurmtel.store.actions)"
ATTEMPT = "job_attempt"
PRICING = "chargeback pricing (slurmtel.chargeback.charge, the statement's rates)"
NODES = "report nodes (slurmtel.store.reports_nodes)"
FABRIC = "report fabric (slurmtel.store.reports_fabric)"
BUDGET = "report budget (slurmtel.budget.BudgetRow)"
STATEMENT = "chargeback statement lines (slurmtel.rows.StatementLine)"


@dataclass(frozen=True)
class Figure:
    name: str
    column: str
    source: str
    unit: str
    meaning: str
    # figure = column x scale (a percentage read as a fraction: 0.01)
    scale: float = 1.0


_FIGURES = (
    # a running job's GPUs (gpus_* rules)
    Figure("gpus", "alloc_gpus", ATTEMPT, "GPUs", "GPUs the job holds"),
    Figure(
        "elapsed_seconds",
        "elapsed_seconds",
        JOB_VIEW,
        "s",
        "time since the job started (to its end once ended)",
    ),
    Figure("time_limit_seconds", "time_limit_seconds", JOB_VIEW, "s", "the job's time limit"),
    Figure("gpu_seconds", "gpu_seconds", ATTEMPT, "GPU-s", "allocated GPU-seconds so far (GPUs x elapsed)"),
    Figure(
        "matched_gpus", "idle_since_at", STREAK, "GPUs", "GPUs in the rule's condition for at least its time"
    ),
    Figure(
        "stretch_seconds",
        "idle_since_at",
        STREAK,
        "s",
        "how long the matched GPUs have been so (the shortest of them: every one has been so at least this long)",
    ),
    Figure(
        "cost_so_far_amount",
        "amount",
        PRICING,
        "currency",
        "what the job's allocation costs so far at the rates",
    ),
    # per GPU of a running job
    Figure(
        "idle_seconds",
        "idle_since_at",
        STREAK,
        "s",
        "the GPU's current stretch of idle windows (inside the job)",
    ),
    Figure(
        "no_process_seconds",
        "no_process_since_at",
        STREAK,
        "s",
        "the GPU's current stretch with no process on it",
    ),
    Figure(
        "idle_util_max_percent", "util_max_percent", STREAK, "%", "highest utilisation in the idle stretch"
    ),
    Figure(
        "idle_memory_used_max_bytes",
        "memory_used_max_bytes",
        STREAK,
        "bytes",
        "highest memory use in the idle stretch",
    ),
    # an ended job (job_end): the figures of `slurmtel job`
    Figure("queue_wait_seconds", "queue_wait_seconds", JOB_VIEW, "s", "start - eligible"),
    Figure("cpus", "cpus", JOB_VIEW, "CPUs", "CPUs allocated"),
    Figure(
        "cpu_efficiency_share", "cpu_efficiency_percent", JOB_VIEW, "1", "CPU time / (CPUs x elapsed)", 0.01
    ),
    Figure("mem_peak_bytes", "mem_peak_bytes", JOB_VIEW, "bytes", "peak host memory (RSS) of the job"),
    Figure("mem_requested_bytes", "mem_requested_bytes", JOB_VIEW, "bytes", "host memory requested"),
    Figure("mean_util_percent", "mean_util_percent", JOB_GPU_VIEW, "%", "time-weighted mean utilisation"),
    Figure("max_util_percent", "max_util_percent", JOB_GPU_VIEW, "%", "highest window utilisation"),
    Figure("idle_share", "idle_percent", JOB_GPU_VIEW, "1", "idle / measured time", 0.01),
    Figure("coverage_share", "coverage_percent", JOB_GPU_VIEW, "1", "measured / allocated time", 0.01),
    Figure(
        "memory_used_max_bytes", "max_memory_gib", JOB_GPU_VIEW, "bytes", "highest GPU memory use", 2.0**30
    ),
    Figure("power_mean_watts", "power_mean_watts", JOB_GPU_VIEW, "W", "mean power draw"),
    Figure("energy_joules", "energy_joules", JOB_GPU_VIEW, "J", "energy used (counter delta)"),
    # node health (admins)
    Figure("attempts", "attempts", NODES, "attempts", "job attempts that ran on the node in the lookback"),
    Figure("failed_attempts", "failed_attempts", NODES, "attempts", "of them user_failure or system_failure"),
    Figure("failed_share", "failed_attempts", NODES, "1", "failed_attempts / attempts"),
    Figure("xid_events", "xid_events", NODES, "events", "XID events in the lookback"),
    Figure("ecc_single_bit", "ecc_single_bit", NODES, "events", "single-bit ECC events"),
    Figure("ecc_double_bit", "ecc_double_bit", NODES, "events", "double-bit ECC events"),
    Figure("avg_busbw_gbps", "avg_busbw_gbps", FABRIC, "GB/s", "the run's average bus bandwidth"),
    Figure("baseline_busbw_gbps", "baseline_busbw_gbps", FABRIC, "GB/s", "median of the earlier ok runs"),
    Figure("busbw_share", "busbw_ratio", FABRIC, "1", "avg / baseline"),
    # budgets (coordinators, finance)
    Figure("budget", "budget", BUDGET, "unit", "the period's budget (GPU-hours or money: see unit)"),
    Figure("used", "used", BUDGET, "unit", "used in the period so far"),
    Figure("committed", "committed", BUDGET, "unit", "what running jobs will use by their time limits"),
    Figure("remaining", "remaining", BUDGET, "unit", "budget - used - committed"),
    Figure("used_share", "used", BUDGET, "1", "used / budget"),
    # a closed month's statement (PIs, coordinators)
    Figure("gpu_hours", "gpu_hours", STATEMENT, "GPU-h", "allocated GPU-hours of the line"),
    Figure("billable_amount", "billable_amount", STATEMENT, "currency", "what the line bills"),
    Figure("total_gpu_hours", "gpu_hours", STATEMENT, "GPU-h", "the account's GPU-hours in the statement"),
    Figure(
        "total_billable_amount", "billable_amount", STATEMENT, "currency", "the account's billable amount"
    ),
    # a rule that would have acted on too many
    Figure(
        "subjects", "subject", "action_log", "jobs", "jobs (nodes, accounts) the rule would have acted on"
    ),
    Figure("max_jobs_per_run", "max_jobs_per_run", "[[actions.rules]]", "jobs", "the rule's limit"),
)

FIGURES: dict[str, Figure] = {f.name: f for f in _FIGURES}

_GPU_RULE = (
    "gpus",
    "elapsed_seconds",
    "time_limit_seconds",
    "gpu_seconds",
    "matched_gpus",
    "stretch_seconds",
    "cost_so_far_amount",
    "idle_seconds",
    "no_process_seconds",
    "idle_util_max_percent",
    "idle_memory_used_max_bytes",
)

# template -> the figures it may show
TEMPLATE_FIGURES: dict[str, tuple[str, ...]] = {
    "gpus_no_process-warning": _GPU_RULE,
    "gpus_no_process-final_warning": _GPU_RULE,
    "gpus_no_process-cancel": _GPU_RULE,
    "gpus_idle-warning": _GPU_RULE,
    "gpus_idle-final_warning": _GPU_RULE,
    "gpus_idle-cancel": _GPU_RULE,
    "job_end-summary": (
        "gpus",
        "elapsed_seconds",
        "time_limit_seconds",
        "gpu_seconds",
        "cost_so_far_amount",
        "queue_wait_seconds",
        "cpus",
        "cpu_efficiency_share",
        "mem_peak_bytes",
        "mem_requested_bytes",
        "mean_util_percent",
        "max_util_percent",
        "idle_share",
        "coverage_share",
        "memory_used_max_bytes",
        "power_mean_watts",
        "energy_joules",
    ),
    "node_health-alert": (
        "attempts",
        "failed_attempts",
        "failed_share",
        "xid_events",
        "ecc_single_bit",
        "ecc_double_bit",
        "avg_busbw_gbps",
        "baseline_busbw_gbps",
        "busbw_share",
    ),
    "budget-threshold": ("budget", "used", "committed", "remaining", "used_share"),
    "month_closed-statement": ("gpu_hours", "billable_amount", "total_gpu_hours", "total_billable_amount"),
    "rule-too_many": ("subjects", "max_jobs_per_run"),
}


def figure(name: str, value: Any) -> Any:
    """VALUE of the column FIGURES[NAME] comes from, as the figure (scaled; None stays None)."""
    spec = FIGURES[name]
    if value is None or spec.scale == 1.0:
        return value
    return round(float(value) * spec.scale, 6)


def figures_from(columns: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The figures NAMES from a row of their source COLUMNS (a job document, a GPU row)."""
    return {name: figure(name, columns.get(FIGURES[name].column)) for name in names}


def jsonable(value: Any) -> Any:
    """Evidence as JSON: money and instants as text."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
