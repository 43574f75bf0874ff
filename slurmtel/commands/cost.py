"""`slurmtel report cost`: effective unit cost, baselines and capacity (docs/reports.md "report cost").

Access: VIEW_STATEMENTS (finance and admins); the figures are cluster-wide.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from slurmtel.access import Action
from slurmtel.commands.common import add_format_argument, add_window_arguments
from slurmtel.commands.views import Connect, Document, View, ViewRequest, document, run_cli, scope_of, section
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import months_text, window_text
from slurmtel.reports.spec import Parameter
from slurmtel.timeparse import report_window

if TYPE_CHECKING:
    from slurmtel.cost import Group

BY = ("cluster", "partition", "account")
KEYS = {
    "cluster": ("kind", "cluster"),
    "partition": ("kind", "cluster", "partition"),
    "account": ("kind", "account"),
}
FIGURES = (
    "period_start_at",
    "period_end_at",
    "calendar_months",
    "currency",
    "installed_gpu_seconds",
    "allocated_gpu_seconds",
    "unused_gpu_seconds",
    "unused_share",
    "unused_cost",
    "retry_gpu_seconds",
    "retry_share",
    "retry_cost",
    "failed_gpu_seconds",
    "useful_gpu_seconds",
    "useful_share",
    "completed_jobs",
    "accepted_unit",
    "accepted_units",
    "total_cost",
    "compute_cost",
    "network_cost",
    "storage_cost",
    "support_cost",
    "operations_cost",
    "gpu_energy_joules",
    "gpu_energy_amount",
    "gpu_co2e_kilograms",
    "cost_per_unit",
    "cost_per_useful_gpu_hour",
    "baseline_price_per_gpu_hour",
    "baseline_gpu_hour_cost",
    "gpu_hour_savings",
    "break_even_useful_ratio",
    "baseline_price_per_unit",
    "baseline_unit_cost",
    "unit_savings",
    "break_even_units",
    "useful_gpu_seconds_per_gpu_month",
    "target_gpu_seconds_per_month",
    "required_gpus",
    "required_gpus_ceil",
)
TABLE_FIGURES = (
    "total_cost",
    "cost_per_useful_gpu_hour",
    "cost_per_unit",
    "unused_share",
    "retry_share",
    "useful_gpu_seconds",
    "installed_gpu_seconds",
    "allocated_gpu_seconds",
    "accepted_units",
    "gpu_hour_savings",
    "unit_savings",
    "break_even_useful_ratio",
    "required_gpus",
)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    cost: argparse.ArgumentParser = reports.add_parser(
        "cost", help="effective unit cost with idle and retries, against a baseline; GPUs a target needs"
    )
    add_window_arguments(cost)
    cost.add_argument(
        "--by", choices=BY, default="cluster", help="rows per cluster (default), partition or account"
    )
    cost.add_argument(
        "--target-work",
        type=_gpu_hours,
        default=None,
        metavar="GPU_HOURS",
        help="useful GPU-hours a month the site must deliver (default cost.target_gpu_hours_per_month)",
    )
    add_format_argument(cost)
    # through slurmtel serve on a login node (api.url), as every report
    cost.set_defaults(handler=cmd_report_cost, through_api=True)


def _gpu_hours(value: str) -> Decimal:
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: '{value}'") from None
    if not number.is_finite() or number < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return number


def cmd_report_cost(args: argparse.Namespace, config: Config) -> int:
    options = {"by": args.by, "target_work": args.target_work}
    return run_cli(VIEW, config, {"start": args.start, "end": args.end, "options": options}, args.format)


def cost_document(config: Config, request: ViewRequest, connect: Connect) -> Document:
    """`report cost` for REQUEST: its one section, a row per cluster, partition or account."""
    from slurmtel.cost import cost_rows, settings_of
    from slurmtel.months import months_in
    from slurmtel.store.cost import completed_jobs, gpu_energy, measured_rows
    from slurmtel.store.reports_admin import window_days

    scope = scope_of(request.identity, Action.VIEW_STATEMENTS)
    by = request.option("by")
    target = request.option("target_work")
    settings = settings_of(config, Decimal(str(target)) if target is not None else None)
    # every value is checked before a database is opened (or an embedded one started)
    now = request.now
    try:
        start, end = report_window(request.start, request.end, now=now, zone=config.zone)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    zone = config.zone
    first_day, last_day = window_days(start, end, zone)
    day_start = datetime.combine(first_day, time(), zone)
    day_end = datetime.combine(last_day + timedelta(days=1), time(), zone)
    period_end = min(day_end, now)
    if period_end <= day_start:
        raise ConfigError("report cost: the period has not begun yet (-S is in the future)")
    with connect(scope) as conn:
        measured = measured_rows(
            conn,
            first_day=first_day,
            last_day=last_day,
            start=day_start,
            end=day_end,
            now=now,
            timezone=config.timezone_name,
            poll_interval_seconds=config.sources.slurmctld.interval_seconds,
            resubmission_window_seconds=config.attribution.resubmission_window_seconds,
        )
        completed = completed_jobs(conn, start=day_start, end=period_end)
        energy = gpu_energy(conn, first_day=first_day, last_day=last_day)
    groups, cluster = build_groups(measured, completed, by)
    months = months_in(day_start, period_end, zone)
    period_hours = Decimal(int((period_end - day_start).total_seconds())) / 3600
    rows = cost_rows(groups, cluster, settings, months=months, period_hours=period_hours)
    for row in rows:
        row["period_start_at"] = day_start
        row["period_end_at"] = period_end
        row.update(energy_figures(row, energy, config))
    title = f"Cost, {window_text(day_start, period_end, zone)} ({months_text(months)}), {settings.currency}"
    keys = KEYS[by]
    cost = section(
        "cost",
        title,
        rows,
        (*keys, *FIGURES),
        (*keys, *TABLE_FIGURES),
        (keys[-1], *TABLE_FIGURES[:4]),
    )
    # one cluster row: a terminal shows it as one figure a line
    return document(
        "cost", [cost], now=now, start=day_start, end=period_end, single=True, transpose=by == "cluster"
    )


VIEW = View(
    name="cost",
    help="effective unit cost with unused GPU time and retries, against a baseline; GPUs a target needs",
    action=Action.VIEW_STATEMENTS,
    build=cost_document,
    sections=tuple((f"--by {by}", (*KEYS[by], *FIGURES)) for by in BY),
    parameters=(
        Parameter("by", str, "cluster", "rows per cluster (default), partition or account", choices=BY),
        Parameter(
            "target_work",
            float,
            None,
            "useful GPU-hours a month the site must deliver (default cost.target_gpu_hours_per_month)",
            minimum=0,
        ),
    ),
    filters=(),
)


def energy_figures(
    row: dict[str, Any], energy: dict[tuple[str, str, str], float], config: Config
) -> dict[str, Any]:
    """The measured energy of ROW's GPUs (its cluster, partition or account; all of it for the
    cluster and total rows), priced at chargeback.price_per_kwh with its kg CO2e at
    chargeback.carbon_grams_per_kwh, as `slurmtel job` prices a job's."""
    from slurmtel.reports.researcher import GpuEnergy, gpu_energy_figures

    def mine(key: tuple[str, str, str]) -> bool:
        if row["kind"] == "partition":
            return (key[0], key[1]) == (row["cluster"], row["partition"])
        if row["kind"] == "account":
            return key[2] == row["account"]
        return True

    measured = [joules for key, joules in energy.items() if mine(key)]
    figures = gpu_energy_figures([GpuEnergy(sum(measured))] if measured else [], config.chargeback)
    return {k: figures[k] for k in ("gpu_energy_joules", "gpu_energy_amount", "gpu_co2e_kilograms")}


def build_groups(
    measured: list[Any], completed: dict[tuple[str, str, str], int], by: str
) -> tuple[list[Group], Group]:
    """(the rows' groups, the cluster) from store.cost's rows and completed-job counts."""
    from slurmtel.cost import Group, total_group

    parts = [r for r in measured if r.kind == "partition"]
    attempts = [r for r in measured if r.kind == "attempt"]
    retry_of: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for a in attempts:
        retry_of[(a.cluster, a.partition)] += a.retry
    jobs_of_partition: dict[tuple[str, str], int] = defaultdict(int)
    jobs_of_account: dict[str, int] = defaultdict(int)
    for (cluster_name, partition, account), n in completed.items():
        jobs_of_partition[(cluster_name, partition)] += n
        jobs_of_account[account] += n
    by_partition: dict[tuple[str, str], Group] = {}
    for p in parts:
        by_partition[(p.cluster, p.partition)] = Group(
            key={"kind": "partition", "cluster": p.cluster, "partition": p.partition},
            basis=p.installed,
            installed=p.installed,
            allocated=p.allocated,
            unused=p.unallocated + p.allocated_idle + p.allocated_no_process,
            retry=retry_of.get((p.cluster, p.partition), Decimal(0)),
            failed=p.failed,
            useful=p.useful,
            completed_jobs=jobs_of_partition.get((p.cluster, p.partition), 0),
        )
    for key, n in jobs_of_partition.items():
        if key not in by_partition:
            # completed jobs whose GPU time is not in the rollup (yet): counted, no GPU-hours
            zero = Decimal(0)
            by_partition[key] = Group(
                {"kind": "partition", "cluster": key[0], "partition": key[1]},
                zero, zero, zero, zero, zero, zero, zero, n,
            )  # fmt: skip
    partitions = [by_partition[k] for k in sorted(by_partition)]
    clusters = ",".join(sorted({k[0] for k in by_partition}))
    cluster = total_group(
        partitions, {"kind": "cluster" if by == "cluster" else "total", "cluster": clusters}
    )
    if by == "cluster":
        return [], cluster
    if by == "partition":
        return partitions, cluster
    accounts: dict[str, Group] = {}
    zero = Decimal(0)
    for a in attempts:
        g = accounts.get(a.account) or Group(
            {"kind": "account", "account": a.account}, zero, None, zero, zero, zero, zero, zero, 0
        )
        accounts[a.account] = Group(
            g.key,
            basis=g.basis + a.allocated,
            installed=None,
            allocated=g.allocated + a.allocated,
            unused=g.unused + a.allocated_idle + a.allocated_no_process,
            retry=g.retry + a.retry,
            failed=g.failed + a.failed,
            useful=g.useful + a.useful,
            completed_jobs=0,
        )
    for account in set(accounts) | set(jobs_of_account):
        g = accounts.get(account) or Group(
            {"kind": "account", "account": account}, zero, None, zero, zero, zero, zero, zero, 0
        )
        accounts[account] = Group(
            g.key,
            g.basis,
            None,
            g.allocated,
            g.unused,
            g.retry,
            g.failed,
            g.useful,
            jobs_of_account.get(account, 0),
        )
    total = Group({"kind": "total", "account": ""}, **{f: getattr(cluster, f) for f in (
        "basis", "installed", "allocated", "unused", "retry", "failed", "useful", "completed_jobs")})  # fmt: skip
    return [accounts[a] for a in sorted(accounts)], total
