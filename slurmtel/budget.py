"""Budgets: per account and period, GPU-hours or money used, committed and remaining.

Pure (no I/O, no clock: AT is passed in). The SQL is in slurmtel.store.budget, the command in
slurmtel.commands.budget. Money is priced exactly as chargeback prices it, with the functions
of slurmtel.chargeback (price_usage, match_rate, charge).

For one budget of account A (covering A and its sub-accounts) and the period P containing AT:

- used: allocated GPU-hours of [P start, AT) from chargeback's usage query; money: the
  `billable_amount` the chargeback statements of P's months would charge for that usage (each
  month priced with its own rates, lines rounded once, then summed).
- committed: attempts running at AT: alloc_gpus x (min(start + time limit, P end) - AT),
  at least 0 (no time limit: until P end); money: priced with the rate the chargeback match gives
  for the month each part falls in.
- remaining = budget - used - committed (negative when over).
- burn rate = used / elapsed days of P (AT - P start).
- projected exhaustion = AT + (budget - used) / burn rate; AT itself when budget - used <= 0
  (already exhausted); none when the burn rate is 0 or the date is not before P end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from decimal import Decimal, localcontext

from slurmtel.chargeback import (
    HOURS,
    ROUNDING,
    TRES_GPU,
    UsageFigure,
    charge,
    hours,
    match_rate,
    money_quantum,
    price_usage,
)
from slurmtel.config import ChargebackConfig
from slurmtel.rows import MonthSlice, RunningAttempt

ZERO = Decimal(0)
SECONDS_PER_DAY = Decimal(86400)
SECONDS_PER_HOUR = Decimal(3600)
MILLISECOND = Decimal("0.001")
UNIT_GPU_HOURS = "gpu_hours"
UNIT_AMOUNT = "amount"
SOURCE_CONFIG = "config"
SOURCE_SLURM = "slurm"
PERIOD_MONTHS = {"month": 1, "quarter": 3, "year": 12}

# The report's columns, in order (registered in slurmtel.columns): a GPU-time budget fills the
# _gpu_seconds figures, a money budget the _amount ones; the other kind is empty.
COLUMNS = (
    "account",
    "period",
    "period_start_at",
    "period_end_at",
    "budget_gpu_seconds",
    "used_gpu_seconds",
    "committed_gpu_seconds",
    "remaining_gpu_seconds",
    "burn_gpu_seconds_per_day",
    "budget_amount",
    "used_amount",
    "committed_amount",
    "remaining_amount",
    "burn_amount_per_day",
    "currency",
    "projected_exhaustion_at",
    "unpriced_gpu_seconds",
    "covered_accounts",
    "source",
)
FIGURES = ("budget", "used", "committed", "remaining")
# what a narrow table keeps: the account and how much is left, of what, until when
KEY_COLUMNS = (
    "account",
    "remaining_gpu_seconds",
    "remaining_amount",
    "used_gpu_seconds",
    "used_amount",
    "projected_exhaustion_at",
)


@dataclass(frozen=True)
class Budget:
    """A budget of ACCOUNT (and its sub-accounts) per PERIOD, in UNIT."""

    account: str
    period: str  # month | quarter | year
    unit: str  # gpu_hours | amount
    value: Decimal
    source: str  # config | slurm
    valid_from: date | None = None


@dataclass(frozen=True)
class Period:
    label: str  # 2026-11, 2026-Q4, 2026
    start_at: datetime
    end_at: datetime


@dataclass(frozen=True)
class BudgetRow:
    """One budget's state at AT. budget, used, committed, remaining and burn_rate_per_day are
    in `unit`: GPU-hours (4 decimals) or money of `currency` (its minor unit)."""

    account: str
    period: str
    period_start_at: datetime
    period_end_at: datetime
    unit: str
    budget: Decimal
    used: Decimal
    committed: Decimal
    remaining: Decimal
    burn_rate_per_day: Decimal
    projected_exhaustion_at: datetime | None
    unpriced_gpu_hours: Decimal  # of used and committed: usage no rate prices (money budgets)
    currency: str
    covered_accounts: tuple[str, ...]
    source: str

    def record(self) -> dict[str, object]:
        """The row as its registered columns: GPU-hours as GPU-seconds, money as amounts."""
        gpu = self.unit == UNIT_GPU_HOURS

        def seconds(hours: Decimal) -> Decimal:
            return (hours * SECONDS_PER_HOUR).quantize(MILLISECOND)

        row: dict[str, object] = {
            "account": self.account,
            "period": self.period,
            "period_start_at": self.period_start_at,
            "period_end_at": self.period_end_at,
        }
        for figure in FIGURES:
            value: Decimal = getattr(self, figure)
            row[f"{figure}_gpu_seconds"] = seconds(value) if gpu else None
            row[f"{figure}_amount"] = None if gpu else value
        row["burn_gpu_seconds_per_day"] = seconds(self.burn_rate_per_day) if gpu else None
        row["burn_amount_per_day"] = None if gpu else self.burn_rate_per_day
        row["currency"] = self.currency
        row["projected_exhaustion_at"] = self.projected_exhaustion_at
        row["unpriced_gpu_seconds"] = seconds(self.unpriced_gpu_hours)
        row["covered_accounts"] = self.covered_accounts
        row["source"] = self.source
        return {c: row[c] for c in COLUMNS}


# --------------------------------------------------------------------------- periods


def _add_months(year: int, month: int, n: int) -> tuple[int, int]:
    index = year * 12 + month - 1 + n
    return index // 12, index % 12 + 1


def period_of(kind: str, at: datetime, zone: tzinfo) -> Period:
    """The calendar month, quarter or year (in ZONE) containing AT, as UTC datetimes."""
    local = at.astimezone(zone)
    length = PERIOD_MONTHS[kind]
    first_month = (local.month - 1) // length * length + 1
    year, month = local.year, first_month
    end_year, end_month = _add_months(year, month, length)
    start = datetime(year, month, 1, tzinfo=zone).astimezone(at.tzinfo)
    end = datetime(end_year, end_month, 1, tzinfo=zone).astimezone(at.tzinfo)
    if kind == "month":
        label = f"{year:04d}-{month:02d}"
    elif kind == "quarter":
        label = f"{year:04d}-Q{(month - 1) // 3 + 1}"
    else:
        label = f"{year:04d}"
    return Period(label, start, end)


def month_slices(period: Period, at: datetime, zone: tzinfo) -> list[MonthSlice]:
    """The period's calendar months cut at AT: the months the usage so far falls in."""
    local = period.start_at.astimezone(zone)
    year, month = local.year, local.month
    result: list[MonthSlice] = []
    while True:
        start = datetime(year, month, 1, tzinfo=zone).astimezone(at.tzinfo)
        if start >= min(at, period.end_at):
            return result
        next_year, next_month = _add_months(year, month, 1)
        end = datetime(next_year, next_month, 1, tzinfo=zone).astimezone(at.tzinfo)
        result.append(MonthSlice(f"{year:04d}-{month:02d}", start, min(end, at, period.end_at)))
        year, month = next_year, next_month


def _month_starts(start: datetime, end: datetime, zone: tzinfo) -> list[tuple[str, datetime, datetime]]:
    """(YYYY-MM, from, to) pieces of [START, END) cut at calendar months of ZONE."""
    local = start.astimezone(zone)
    year, month = local.year, local.month
    result = []
    cursor = start
    while cursor < end:
        next_year, next_month = _add_months(year, month, 1)
        boundary = datetime(next_year, next_month, 1, tzinfo=zone).astimezone(start.tzinfo)
        result.append((f"{year:04d}-{month:02d}", cursor, min(boundary, end)))
        cursor = boundary
        year, month = next_year, next_month
    return result


# --------------------------------------------------------------------------- which budgets


def configured_budgets(config: ChargebackConfig, at: datetime, zone: tzinfo) -> list[Budget]:
    """The [[chargeback.budgets]] that apply at AT: per (account, period), among the entries
    whose valid_from is on or before the period's first day, the latest."""
    chosen: dict[tuple[str, str], Budget] = {}
    for entry in config.budgets:
        valid_from = date.fromisoformat(entry.valid_from) if entry.valid_from else None
        first_day = period_of(entry.period, at, zone).start_at.astimezone(zone).date()
        if valid_from is not None and valid_from > first_day:
            continue
        unit = UNIT_GPU_HOURS if entry.gpu_hours.strip() else UNIT_AMOUNT
        value = Decimal((entry.gpu_hours if unit == UNIT_GPU_HOURS else entry.amount).strip())
        budget = Budget(entry.account, entry.period, unit, value, SOURCE_CONFIG, valid_from)
        key = (entry.account, entry.period)
        other = chosen.get(key)
        if other is None or (other.valid_from or date.min) < (valid_from or date.min):
            chosen[key] = budget
    return sorted(chosen.values(), key=lambda b: (b.account, b.period))


def slurm_budgets(gpu_minutes: Mapping[str, int], period: str) -> list[Budget]:
    """GrpTRESMins gres/gpu (GPU-minutes per account) as GPU-hour budgets per PERIOD."""
    return [
        Budget(account, period, UNIT_GPU_HOURS, Decimal(minutes) / 60, SOURCE_SLURM)
        for account, minutes in sorted(gpu_minutes.items())
    ]


def merge_budgets(configured: Sequence[Budget], from_slurm: Sequence[Budget]) -> list[Budget]:
    """Configured budgets, plus Slurm's for accounts that have no configured one."""
    have = {b.account for b in configured}
    merged = [*configured, *(b for b in from_slurm if b.account not in have)]
    return sorted(merged, key=lambda b: (b.account, b.period))


# --------------------------------------------------------------------------- figures


def _round(value: Decimal, quantum: Decimal) -> Decimal:
    """Rounded once as chargeback rounds (ROUND_HALF_EVEN), never "-0.00"."""
    rounded = value.quantize(quantum, rounding=ROUNDING)
    return rounded.copy_abs() if rounded.is_zero() else rounded


def _quantum(unit: str, currency: str) -> Decimal:
    return HOURS if unit == UNIT_GPU_HOURS else money_quantum(currency)


def used_figures(
    unit: str,
    usage_by_month: Mapping[str, Sequence[UsageFigure]],
    config: ChargebackConfig,
) -> tuple[Decimal, Decimal]:
    """(used in UNIT, unpriced GPU-hours) of the figures of each month (already restricted to
    the budget's accounts). Money: each month's usage lines priced as its statement prices
    them; the sum of their rounded billable amounts."""
    if unit == UNIT_GPU_HOURS:
        seconds = sum(
            (f.tres_seconds for figures in usage_by_month.values() for f in figures if f.tres == TRES_GPU),
            ZERO,
        )
        return hours(seconds), ZERO
    used = unpriced = ZERO
    for month, figures in sorted(usage_by_month.items()):
        for line in price_usage(figures, month, config):
            if line.billable_amount is not None:
                used += line.billable_amount
            elif line.tres == TRES_GPU:
                unpriced += hours(line.allocated_tres_seconds)
    return used, unpriced


def committed_figures(
    unit: str,
    running: Iterable[RunningAttempt],
    period: Period,
    at: datetime,
    zone: tzinfo,
    config: ChargebackConfig,
) -> tuple[Decimal, Decimal]:
    """(committed in UNIT, unpriced GPU-hours) of the attempts running at AT.

    GPU-hours: alloc_gpus x (min(start + time limit, period end) - AT), at least 0, summed
    exactly and rounded once. Money: the GPU-seconds (billing-seconds with use_billing_tres)
    grouped by (partition, GPU model, month) and priced with the rate the chargeback match
    gives on that month's first day, each group rounded once."""
    gpu_seconds = ZERO
    groups: dict[tuple[str, str, str], tuple[Decimal, Decimal]] = {}
    for attempt in running:
        until = period.end_at
        if attempt.time_limit_seconds is not None:
            until = min(until, attempt.start_at + timedelta(seconds=attempt.time_limit_seconds))
        for month, start, end in _month_starts(at, until, zone):
            seconds = Decimal(int((end - start).total_seconds()))
            key = (attempt.partition, attempt.gpu_model, month)
            gpu, billing = groups.get(key, (ZERO, ZERO))
            groups[key] = (gpu + attempt.alloc_gpus * seconds, billing + attempt.billing * seconds)
            gpu_seconds += attempt.alloc_gpus * seconds
    if unit == UNIT_GPU_HOURS:
        return hours(gpu_seconds), ZERO
    committed = unpriced = ZERO
    for (partition, model, month), (gpu, billing) in sorted(groups.items()):
        first_day = date(int(month[:4]), int(month[5:]), 1)
        if config.use_billing_tres:
            rate = Decimal(config.billing_rate) if billing > 0 else None
            basis = billing
        else:
            matched = match_rate(config.rates, partition, model, first_day)
            rate = matched.price() if matched is not None else None
            basis = gpu
        if rate is None:
            unpriced += hours(gpu)
        else:
            committed += charge(rate, basis, config.currency)
    return committed, unpriced


def budget_row(
    budget: Budget,
    period: Period,
    at: datetime,
    used: Decimal,
    committed: Decimal,
    unpriced_gpu_hours: Decimal,
    covered_accounts: Iterable[str],
    currency: str,
) -> BudgetRow:
    """The row of BUDGET at AT from its used and committed figures (already in its unit)."""
    quantum = _quantum(budget.unit, currency)
    value = _round(budget.value, quantum)
    used, committed = _round(used, quantum), _round(committed, quantum)
    elapsed = Decimal(int((min(at, period.end_at) - period.start_at).total_seconds()))
    projected: datetime | None = None
    burn_per_day = ZERO
    with localcontext() as ctx:
        ctx.prec = 50
        if elapsed > 0 and used > 0:
            per_second = used / elapsed
            burn_per_day = per_second * SECONDS_PER_DAY
            left = value - used
            if left <= 0:
                projected = at
            else:
                candidate = at + timedelta(seconds=int(left / per_second))
                projected = candidate if candidate < period.end_at else None
    return BudgetRow(
        account=budget.account,
        period=period.label,
        period_start_at=period.start_at,
        period_end_at=period.end_at,
        unit=budget.unit,
        budget=value,
        used=used,
        committed=committed,
        remaining=_round(value - used - committed, quantum),
        burn_rate_per_day=_round(burn_per_day, quantum),
        projected_exhaustion_at=projected,
        unpriced_gpu_hours=_round(unpriced_gpu_hours, HOURS),
        currency=currency if budget.unit == UNIT_AMOUNT else "",
        covered_accounts=tuple(sorted(covered_accounts)),
        source=budget.source,
    )
