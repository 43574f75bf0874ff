"""Every figure a message shows, declared once: a registered column (slurmtel.columns: its
kind, unit and meaning; tests/test_actions_templates.py checks each is), the field it is read
from and where that field is computed.

A template may show a figure only through these names (`figures.<name>` for the job, node,
account or month; `gpu.<name>` for each GPU): tests/test_actions_templates.py reads every
shipped template and fails on a figure that is not declared here or not listed for that
template in TEMPLATE_FIGURES. Where the source field is a percentage, the figure is the
registered fraction (scale 0.01). Messages print them with the filters of
slurmtel.actions.render (the one place that turns seconds, bytes and shares into text).
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
    """A figure a message shows: a registered column (slurmtel.columns: its kind, unit and
    meaning), the field it is read from and where that is computed."""

    name: str
    column: str
    source: str
    # figure = column x scale (a percentage read as a fraction: 0.01)
    scale: float = 1.0


_FIGURES = (
    # a running job's GPUs (gpus_* rules)
    Figure("gpus", "alloc_gpus", ATTEMPT),
    Figure("elapsed_seconds", "elapsed_seconds", JOB_VIEW),
    Figure("time_limit_seconds", "time_limit_seconds", JOB_VIEW),
    Figure("allocated_gpu_seconds", "gpu_seconds", ATTEMPT),
    Figure("matched_gpus", "idle_since_at", STREAK),
    Figure("stretch_seconds", "idle_since_at", STREAK),
    Figure("cost_so_far_amount", "amount", PRICING),
    # per GPU of a running job
    Figure("idle_stretch_seconds", "idle_since_at", STREAK),
    Figure("no_process_stretch_seconds", "no_process_since_at", STREAK),
    Figure("idle_stretch_util_max_share", "util_max_percent", STREAK, 0.01),
    Figure("idle_stretch_memory_used_max_bytes", "memory_used_max_bytes", STREAK),
    # an ended job (job_end): the figures of `slurmtel job`
    Figure("queue_wait_seconds", "queue_wait_seconds", JOB_VIEW),
    Figure("cpus", "cpus", JOB_VIEW),
    Figure("cpu_efficiency_share", "cpu_efficiency_share", JOB_VIEW),
    Figure("mem_peak_bytes", "mem_peak_bytes", JOB_VIEW),
    Figure("mem_requested_bytes", "mem_requested_bytes", JOB_VIEW),
    Figure("mean_util_share", "mean_util_share", JOB_GPU_VIEW),
    Figure("max_util_share", "max_util_share", JOB_GPU_VIEW),
    Figure("idle_share", "idle_share", JOB_GPU_VIEW),
    Figure("covered_share", "covered_share", JOB_GPU_VIEW),
    Figure("memory_used_max_bytes", "memory_used_max_bytes", JOB_GPU_VIEW),
    Figure("power_mean_watts", "power_mean_watts", JOB_GPU_VIEW),
    Figure("energy_joules", "energy_joules", JOB_GPU_VIEW),
    # node health (admins)
    Figure("attempts", "attempts", NODES),
    Figure("failed_attempts", "failed_attempts", NODES),
    Figure("failed_attempts_share", "failed_attempts", NODES),
    Figure("xid_events", "xid_events", NODES),
    Figure("ecc_single_bit_errors", "ecc_single_bit_errors", NODES),
    Figure("ecc_double_bit_errors", "ecc_double_bit_errors", NODES),
    Figure("avg_busbw_gbytes_per_second", "avg_busbw_gbytes_per_second", FABRIC),
    Figure("baseline_busbw_gbytes_per_second", "baseline_busbw_gbytes_per_second", FABRIC),
    Figure("busbw_ratio", "busbw_ratio", FABRIC),
    # budgets (coordinators, finance): a GPU-time budget's _gpu_seconds, a money budget's _amount
    *(
        Figure(f"{f}_gpu_seconds", f"{f}_gpu_seconds", BUDGET)
        for f in ("budget", "used", "committed", "remaining")
    ),
    *(Figure(f"{f}_amount", f"{f}_amount", BUDGET) for f in ("budget", "used", "committed", "remaining")),
    Figure("budget_used_share", "used", BUDGET),
    # a closed month's statement (PIs, coordinators)
    Figure("billed_quantity", "billed_quantity", STATEMENT),
    Figure("billable_amount", "billable_amount", STATEMENT),
    Figure("total_billable_amount", "billable_amount", STATEMENT),
    # a rule that would have acted on too many
    Figure("subjects", "subject", "action_log"),
    Figure("max_jobs_per_run", "max_jobs_per_run", "[[actions.rules]]"),
)

FIGURES: dict[str, Figure] = {f.name: f for f in _FIGURES}

_GPU_RULE = (
    "gpus",
    "elapsed_seconds",
    "time_limit_seconds",
    "allocated_gpu_seconds",
    "matched_gpus",
    "stretch_seconds",
    "cost_so_far_amount",
    "idle_stretch_seconds",
    "no_process_stretch_seconds",
    "idle_stretch_util_max_share",
    "idle_stretch_memory_used_max_bytes",
)
_BUDGET = (
    *(f"{f}_gpu_seconds" for f in ("budget", "used", "committed", "remaining")),
    *(f"{f}_amount" for f in ("budget", "used", "committed", "remaining")),
    "budget_used_share",
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
        "allocated_gpu_seconds",
        "cost_so_far_amount",
        "queue_wait_seconds",
        "cpus",
        "cpu_efficiency_share",
        "mem_peak_bytes",
        "mem_requested_bytes",
        "mean_util_share",
        "max_util_share",
        "idle_share",
        "covered_share",
        "memory_used_max_bytes",
        "power_mean_watts",
        "energy_joules",
    ),
    "node_health-alert": (
        "attempts",
        "failed_attempts",
        "failed_attempts_share",
        "xid_events",
        "ecc_single_bit_errors",
        "ecc_double_bit_errors",
        "avg_busbw_gbytes_per_second",
        "baseline_busbw_gbytes_per_second",
        "busbw_ratio",
    ),
    "budget-threshold": _BUDGET,
    "month_closed-statement": ("billed_quantity", "billable_amount", "total_billable_amount"),
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
