"""`slurmtel report cost`: the effective unit cost of the cluster, a baseline to beat and the
GPUs a target needs (docs/reports.md "report cost", where every formula sits next to its inputs).

Pure computation over measured GPU-seconds (slurmtel.store.cost) and the [cost] settings.
Money and hours are Decimal throughout; every printed figure is computed from exact values
(50 significant digits) and rounded once: money to the currency's minor unit, half-even.
Where money is split (partitions, accounts, the cost components), the rounded parts are
apportioned by largest remainder so that they add up to the rounded total exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal, localcontext
from typing import Any

from slurmtel.chargeback import money_quantum
from slurmtel.config import COST_MONEY_KEYS, Config
from slurmtel.errors import ConfigError
from slurmtel.months import per_gpu_month

PRECISION = 50
HOURS = Decimal("0.0001")
MILLISECONDS = Decimal("0.001")
SHARE = Decimal("0.0001")
GPUS = Decimal("0.01")
SECONDS_PER_HOUR = Decimal(3600)
COMPONENTS = ("compute", "network", "storage", "support", "operations")


@dataclass(frozen=True)
class CostSettings:
    """[cost], parsed: monthly costs per component, the unit, baselines, target."""

    currency: str
    monthly: Mapping[str, Decimal]
    unit: str
    unit_name: str
    units_per_month: Decimal | None
    baseline_price_per_gpu_hour: Decimal | None
    baseline_price_per_unit: Decimal | None
    target_gpu_hours_per_month: Decimal | None


def settings_of(config: Config, target_work: Decimal | None = None) -> CostSettings:
    """The report's settings; a ConfigError naming every monthly cost key not set."""
    cost = config.cost
    missing = [f"cost.{key}" for key in COST_MONEY_KEYS if not getattr(cost, key).strip()]
    if missing:
        raise ConfigError(
            "report cost needs the monthly costs in [cost]; not set: "
            + ", ".join(missing)
            + ' (decimal strings in chargeback.currency, "0" for none; see docs/reports.md "report cost")'
        )

    def optional(value: str) -> Decimal | None:
        return Decimal(value.strip()) if value.strip() else None

    target = target_work if target_work is not None else optional(cost.target_gpu_hours_per_month)
    return CostSettings(
        currency=config.chargeback.currency,
        monthly={c: Decimal(getattr(cost, f"{c}_per_month").strip()) for c in COMPONENTS},
        unit=cost.unit,
        unit_name=cost.unit_name if cost.unit == "configured" else cost.unit,
        units_per_month=optional(cost.units_per_month),
        baseline_price_per_gpu_hour=optional(cost.baseline_price_per_gpu_hour),
        baseline_price_per_unit=optional(cost.baseline_price_per_unit),
        target_gpu_hours_per_month=target,
    )


@dataclass(frozen=True)
class Group:
    """The measured GPU-seconds of one row (cluster, partition, account or the total).

    basis: the GPU-seconds the row's cost share and utilisation are taken over (installed for
    the cluster and partitions, allocated for accounts). unused: allocated idle + no-process,
    plus unallocated where the basis is installed."""

    key: Mapping[str, str]
    basis: Decimal
    installed: Decimal | None
    allocated: Decimal
    unused: Decimal
    retry: Decimal
    failed: Decimal
    useful: Decimal
    completed_jobs: int


def allocate_money(exact: Sequence[Decimal], quantum: Decimal) -> list[Decimal]:
    """EXACT amounts rounded to QUANTUM so that they add up to their rounded sum exactly
    (largest remainder; the sum rounds half-even; ties go to the earlier part)."""
    with localcontext() as ctx:
        ctx.prec = PRECISION
        total = _round(sum(exact, Decimal(0)), quantum)
        floors = [(e / quantum).to_integral_value(rounding=ROUND_FLOOR) for e in exact]
        missing = int(total / quantum - sum(floors, Decimal(0)))
        order = sorted(range(len(exact)), key=lambda i: (exact[i] / quantum - floors[i], -i), reverse=True)
        units = list(floors)
        for i in order[:missing]:
            units[i] += 1
        return [_clean((u * quantum).quantize(quantum)) for u in units]


def _round(value: Decimal, quantum: Decimal) -> Decimal:
    return _clean(value.quantize(quantum, rounding=ROUND_HALF_EVEN))


def _clean(value: Decimal) -> Decimal:
    return value.copy_abs() if value.is_zero() else value


def _gpu_seconds(seconds: Decimal) -> Decimal:
    return _round(seconds, MILLISECONDS)


def _share(part: Decimal, whole: Decimal) -> Decimal | None:
    return _round(part / whole, SHARE) if whole else None


def period_cost(settings: CostSettings, months: Decimal) -> dict[str, Decimal]:
    """component -> exact cost in the period: monthly cost x months."""
    with localcontext() as ctx:
        ctx.prec = PRECISION
        return {c: settings.monthly[c] * months for c in COMPONENTS}


def cost_rows(
    groups: Sequence[Group],
    cluster: Group,
    settings: CostSettings,
    *,
    months: Decimal,
    period_hours: Decimal,
) -> list[dict[str, Any]]:
    """One row per group (its share of the cluster's cost by basis GPU-hours, apportioned to
    the minor unit so that the groups add up to the cluster's total exactly), then the
    CLUSTER row, which also splits the total into its components (apportioned the same way)."""
    quantum = money_quantum(settings.currency)
    with localcontext() as ctx:
        ctx.prec = PRECISION
        components = period_cost(settings, months)
        total_exact = sum(components.values(), Decimal(0))
        basis_total = sum((g.basis for g in groups), Decimal(0))
        # nothing measured in any group: nothing to share out, the cost stays with the cluster
        exact = [total_exact * g.basis / basis_total if basis_total else Decimal(0) for g in groups]
        money = allocate_money(exact, quantum)
        rows = [
            _row(g, e, m, cluster, settings, months=months, period_hours=period_hours)
            for g, e, m in zip(groups, exact, money, strict=True)
        ]
        total = _row(
            cluster, total_exact, _round(total_exact, quantum), cluster, settings, months=months,
            period_hours=period_hours,
        )  # fmt: skip
        parts = allocate_money([components[c] for c in COMPONENTS], quantum)
        for component, amount in zip(COMPONENTS, parts, strict=True):
            total[f"{component}_cost"] = amount
        return [*rows, total]


def _row(
    group: Group,
    exact_cost: Decimal,
    cost: Decimal,
    cluster: Group,
    settings: CostSettings,
    *,
    months: Decimal,
    period_hours: Decimal,
) -> dict[str, Any]:
    quantum = money_quantum(settings.currency)
    row: dict[str, Any] = dict(group.key)
    row["calendar_months"] = _round(months, Decimal("0.000001"))
    row["currency"] = settings.currency
    row["installed_gpu_seconds"] = _gpu_seconds(group.installed) if group.installed is not None else None
    row["allocated_gpu_seconds"] = _gpu_seconds(group.allocated)
    row["unused_gpu_seconds"] = _gpu_seconds(group.unused)
    row["unused_share"] = _share(group.unused, group.basis)
    row["unused_cost"] = _round(exact_cost * group.unused / group.basis, quantum) if group.basis else None
    row["retry_gpu_seconds"] = _gpu_seconds(group.retry)
    row["retry_share"] = _share(group.retry, group.basis)
    row["retry_cost"] = _round(exact_cost * group.retry / group.basis, quantum) if group.basis else None
    row["failed_gpu_seconds"] = _gpu_seconds(group.failed)
    row["useful_gpu_seconds"] = _gpu_seconds(group.useful)
    row["useful_share"] = _share(group.useful, group.basis)
    row["completed_jobs"] = group.completed_jobs
    units = _units(group, cluster, settings, months)
    row["accepted_unit"] = settings.unit_name
    row["accepted_units"] = units if isinstance(units, int) else _round(units, HOURS)
    row["total_cost"] = cost
    for c in COMPONENTS:
        row[f"{c}_cost"] = None
    row["cost_per_unit"] = _round(exact_cost / units, quantum) if units else None
    useful_hours = group.useful / SECONDS_PER_HOUR
    row["cost_per_useful_gpu_hour"] = _round(exact_cost / useful_hours, quantum) if useful_hours else None
    basis_hours = group.basis / SECONDS_PER_HOUR
    price = settings.baseline_price_per_gpu_hour
    row["baseline_price_per_gpu_hour"] = price
    row["baseline_gpu_hour_cost"] = _round(price * useful_hours, quantum) if price is not None else None
    row["gpu_hour_savings"] = (
        _round(price * useful_hours - exact_cost, quantum) if price is not None else None
    )
    row["break_even_useful_ratio"] = (
        _round(exact_cost / (basis_hours * price), SHARE) if price and basis_hours else None
    )
    unit_price = settings.baseline_price_per_unit
    row["baseline_price_per_unit"] = unit_price
    row["baseline_unit_cost"] = _round(unit_price * units, quantum) if unit_price is not None else None
    row["unit_savings"] = _round(unit_price * units - exact_cost, quantum) if unit_price is not None else None
    row["break_even_units"] = _round(exact_cost / unit_price, HOURS) if unit_price else None
    per_month = per_gpu_month(group.useful, group.basis, period_hours * SECONDS_PER_HOUR, months)
    row["useful_gpu_seconds_per_gpu_month"] = _gpu_seconds(per_month) if per_month is not None else None
    target = settings.target_gpu_hours_per_month
    row["target_gpu_seconds_per_month"] = (
        _gpu_seconds(target * SECONDS_PER_HOUR) if target is not None else None
    )
    required = target * SECONDS_PER_HOUR / per_month if target is not None and per_month else None
    row["required_gpus"] = _round(required, GPUS) if required is not None else None
    row["required_gpus_ceil"] = math.ceil(required) if required is not None else None
    return row


def _units(group: Group, cluster: Group, settings: CostSettings, months: Decimal) -> Decimal | int:
    """Accepted units of GROUP: completed jobs; useful GPU-hours; or the configured units of
    the period, shared out by useful GPU-hours."""
    if settings.unit == "completed_jobs":
        return group.completed_jobs
    if settings.unit == "completed_gpu_hours":
        return group.useful / SECONDS_PER_HOUR
    units = (settings.units_per_month or Decimal(0)) * months
    if group is cluster:
        return units
    return units * group.useful / cluster.useful if cluster.useful else Decimal(0)


def total_group(groups: Sequence[Group], key: Mapping[str, str]) -> Group:
    """The sum of GROUPS under KEY (installed: of the groups that have it; 0 for none)."""
    first = Group(key, Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0), 0)
    result = first
    for g in groups:
        result = replace(
            result,
            basis=result.basis + g.basis,
            installed=(result.installed or Decimal(0)) + g.installed
            if g.installed is not None
            else result.installed,
            allocated=result.allocated + g.allocated,
            unused=result.unused + g.unused,
            retry=result.retry + g.retry,
            failed=result.failed + g.failed,
            useful=result.useful + g.useful,
            completed_jobs=result.completed_jobs + g.completed_jobs,
        )
    return result
