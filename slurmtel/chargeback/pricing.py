"""Chargeback's money logic (pure: no I/O, no clock): rate matching, pricing, rounding,
adjustments, totals, the pricing a statement freezes, and which month is due."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import date, datetime, timedelta
from decimal import Decimal, localcontext
from typing import Any

from slurmtel.chargeback.model import (
    HOURS,
    MINOR_UNITS,
    RATE_UNIT_BILLING,
    RATE_UNIT_GPU,
    ROUNDING,
    SECONDS_PER_HOUR,
    ZERO,
    CompletedJobCost,
    Statement,
    Totals,
)
from slurmtel.config import ChargebackConfig, ChargebackRate, Config
from slurmtel.errors import ChargebackError
from slurmtel.rows import (
    Key,
    StatementLine,
    UsageFigure,
)
from slurmtel.timeparse import month_first_day, month_of, next_month, previous_month


def money_quantum(currency: str) -> Decimal:
    """The currency's minor unit: Decimal('0.01') for EUR, Decimal('1') for JPY."""
    return Decimal(1).scaleb(-MINOR_UNITS.get(currency, 2))


def _round(value: Decimal, quantum: Decimal) -> Decimal:
    rounded = value.quantize(quantum, rounding=ROUNDING)
    # never print "-0.00"
    return rounded.copy_abs() if rounded.is_zero() else rounded


def hours(seconds: Decimal) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 50
        return _round(seconds / SECONDS_PER_HOUR, HOURS)


def charge(rate: Decimal, seconds: Decimal, currency: str) -> Decimal:
    """rate (per hour) x seconds, rounded once to the currency's minor unit."""
    with localcontext() as ctx:
        ctx.prec = 50
        return _round(rate * seconds / SECONDS_PER_HOUR, money_quantum(currency))


def match_rate(
    rates: Sequence[ChargebackRate], partition: str, gpu_model: str, on: date
) -> ChargebackRate | None:
    """The rate for (PARTITION, GPU_MODEL) on day ON: most specific first, then latest."""
    model = gpu_model.lower()
    best: tuple[int, date] | None = None
    chosen = None
    for rate in rates:
        valid_from = rate.valid_from_date()
        if valid_from > on:
            continue
        if rate.partition not in ("*", partition):
            continue
        if rate.gpu_model != "*" and rate.gpu_model.lower() != model:
            continue
        specificity = 2 * (rate.partition != "*") + (rate.gpu_model != "*")
        rank = (specificity, valid_from)
        if best is None or rank > best:
            best, chosen = rank, rate
    return chosen


def price_usage(figures: Iterable[UsageFigure], month: str, config: ChargebackConfig) -> list[StatementLine]:
    """Usage lines of MONTH, priced with the rates valid on its first day, sorted by key."""
    first_day = month_first_day(month)
    currency = config.currency
    lines = []
    for f in sorted(figures, key=lambda f: (f.cluster, f.account, f.user, f.partition, f.gpu_model)):
        waived_gpu = f.system_failure_gpu_seconds if config.waive_system_failures else ZERO
        waived_billing = f.system_failure_billing_seconds if config.waive_system_failures else ZERO
        rate: Decimal | None
        if config.use_billing_tres:
            # no billing TRES on the attempts: unpriced, not free
            rate = Decimal(config.billing_rate) if f.billing_seconds > 0 or f.gpu_seconds == 0 else None
            unit, basis, waived_basis = RATE_UNIT_BILLING, f.billing_seconds, waived_billing
        else:
            matched = match_rate(config.rates, f.partition, f.gpu_model, first_day)
            rate = matched.price() if matched is not None else None
            unit, basis, waived_basis = RATE_UNIT_GPU, f.gpu_seconds, waived_gpu
        amount = waived_amount = billable = None
        if rate is not None:
            amount = charge(rate, basis, currency)
            waived_amount = charge(rate, waived_basis, currency)
            billable = amount - waived_amount
        gpu_hours = hours(f.gpu_seconds)
        lines.append(
            StatementLine(
                kind="usage",
                for_month=month,
                cluster=f.cluster,
                account=f.account,
                user=f.user,
                partition=f.partition,
                gpu_model=f.gpu_model,
                gpu_hours=gpu_hours,
                billing_hours=hours(f.billing_seconds),
                priced=rate is not None,
                rate=rate,
                rate_unit=unit,
                amount=amount,
                waived_gpu_hours=hours(waived_gpu),
                waived_amount=waived_amount,
                billable_amount=billable,
                unpriced_gpu_hours=hours(ZERO) if rate is not None else gpu_hours,
            )
        )
    return lines


_SUMMED = (
    "gpu_hours",
    "billing_hours",
    "amount",
    "waived_gpu_hours",
    "waived_amount",
    "billable_amount",
    "unpriced_gpu_hours",
)


def _sum(lines: Iterable[StatementLine], name: str) -> Decimal:
    total = ZERO
    for line in lines:
        value = getattr(line, name)
        if value is not None:
            total += value
    return total


def adjustment_lines(
    for_month: str,
    current: Sequence[StatementLine],
    frozen: Sequence[StatementLine],
    already: Sequence[StatementLine],
) -> list[StatementLine]:
    """Lines charging FOR_MONTH's late changes: current - frozen - already adjusted.

    CURRENT: FOR_MONTH's usage lines computed now; FROZEN: the usage lines its closed
    statement holds; ALREADY: adjustment lines for FOR_MONTH in later closed statements.
    Keys whose every figure nets to zero give no line.
    """
    by_key: dict[Key, tuple[list[StatementLine], list[StatementLine]]] = {}
    for line in current:
        by_key.setdefault(line.key, ([], []))[0].append(line)
    for line in [*frozen, *already]:
        by_key.setdefault(line.key, ([], []))[1].append(line)
    result = []
    for key in sorted(by_key):
        now_lines, before = by_key[key]
        delta = {name: _sum(now_lines, name) - _sum(before, name) for name in _SUMMED}
        if all(v == 0 for v in delta.values()):
            continue
        reference = now_lines[0] if now_lines else before[0]
        priced = any(line.priced for line in [*now_lines, *before])
        result.append(
            replace(
                reference,
                kind="adjustment",
                for_month=for_month,
                cause=adjustment_cause(for_month, delta["gpu_hours"], delta["billing_hours"]),
                rate=reference.rate if reference.priced else None,
                priced=priced,
                gpu_hours=_clean(delta["gpu_hours"]),
                billing_hours=_clean(delta["billing_hours"]),
                amount=_clean(delta["amount"]) if priced else None,
                waived_gpu_hours=_clean(delta["waived_gpu_hours"]),
                waived_amount=_clean(delta["waived_amount"]) if priced else None,
                billable_amount=_clean(delta["billable_amount"]) if priced else None,
                unpriced_gpu_hours=_clean(delta["unpriced_gpu_hours"]),
            )
        )
    return result


def adjustment_cause(for_month: str, gpu_hours: Decimal, billing_hours: Decimal) -> str:
    """Why an adjustment line exists. Closed months are re-priced with their own frozen rates
    and edges, so only usage that changed after the close makes one."""
    change = gpu_hours if gpu_hours != 0 else billing_hours
    unit = "GPU-hours" if gpu_hours != 0 else "billing-hours"
    if change > 0:
        return f"usage of {for_month} that arrived after it was closed: {_clean(change):+} {unit}"
    if change < 0:
        return f"usage of {for_month} revised down after it was closed: {_clean(change):+} {unit}"
    return f"waiver or pricing basis of {for_month} usage changed after it was closed"


def _clean(value: Decimal) -> Decimal:
    return value.copy_abs() if value.is_zero() else value


def totals(lines: Sequence[StatementLine], currency: str) -> Totals:
    """Sums of the rounded lines (usage and adjustments); money of unpriced lines counts 0."""
    money = money_quantum(currency)
    return Totals(
        **{name: _round(_sum(lines, name), money if name.endswith("amount") else HOURS) for name in _SUMMED}
    )


def completed_job_costs(
    lines: Sequence[StatementLine], completed: Mapping[str, int], currency: str
) -> list[CompletedJobCost]:
    """Per account: this month's cost / jobs whose last attempt completed this month.

    cost_per_completed_job divides the total amount (waived failures included: what getting
    the work done cost), billable_per_completed_job the billable amount; both rounded once.
    Money is empty (None) for an account none of whose usage is priced.
    """
    usage = [line for line in lines if line.kind == "usage"]
    accounts = sorted({line.account for line in usage} | {a for a, n in completed.items() if n})
    quantum = money_quantum(currency)
    result = []
    for account in accounts:
        mine = [line for line in usage if line.account == account]
        jobs = int(completed.get(account, 0))
        priced = any(line.priced for line in mine)
        amount = _round(_sum(mine, "amount"), quantum) if priced else None
        billable = _round(_sum(mine, "billable_amount"), quantum) if priced else None
        result.append(
            CompletedJobCost(
                account=account,
                completed_jobs=jobs,
                gpu_hours=_round(_sum(mine, "gpu_hours"), HOURS),
                amount=amount,
                billable_amount=billable,
                unpriced_gpu_hours=_round(_sum(mine, "unpriced_gpu_hours"), HOURS),
                cost_per_completed_job=_round(amount / jobs, quantum)
                if jobs and amount is not None
                else None,
                billable_per_completed_job=(
                    _round(billable / jobs, quantum) if jobs and billable is not None else None
                ),
            )
        )
    return result


def settings_of(config: ChargebackConfig, timezone: str = "") -> dict[str, Any]:
    """What a statement was computed with (stored with a closed statement)."""
    return {
        "timezone": timezone,
        "currency": config.currency,
        "rounding": ROUNDING,
        "waive_system_failures": config.waive_system_failures,
        "use_billing_tres": config.use_billing_tres,
        "billing_rate": config.billing_rate,
        "rates": [asdict(rate) for rate in config.rates],
    }


def frozen_pricing(settings: Mapping[str, Any]) -> ChargebackConfig:
    """The pricing a closed statement was computed with, from its stored settings: a closed
    month is only ever priced with these, whatever the config says today."""
    return ChargebackConfig(
        currency=str(settings.get("currency", "EUR")),
        waive_system_failures=bool(settings.get("waive_system_failures", True)),
        use_billing_tres=bool(settings.get("use_billing_tres", False)),
        billing_rate=str(settings.get("billing_rate", "")),
        rates=[ChargebackRate(**rate) for rate in settings.get("rates", [])],
    )


def rate_notices(config: Config, closed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What today's config would change in closed months, said once per rate or setting: it
    never re-prices them (CLOSED: month -> its statement's settings). A changed rate takes
    effect from the first open month; a changed time zone cuts only open months."""
    if not closed:
        return []
    first_open = next_month(max(closed))
    notices = []
    for rate in config.chargeback.rates:
        covered = [
            month
            for month, settings in sorted(closed.items())
            if asdict(rate) not in settings.get("rates", [])
            and rate.valid_from_date() <= _month_last_day(month)
        ]
        if covered:
            notices.append(
                f"rate {rate.partition}/{rate.gpu_model} {rate.price_per_gpu_hour} valid from "
                f"{rate.valid_from} covers closed month(s) {', '.join(covered)}: their statements keep "
                f"the rates they were closed with; it takes effect from {first_open}, the first open month"
            )
    for month, settings in sorted(closed.items()):
        frozen = frozen_pricing(settings)
        dropped = [
            r
            for r in frozen.rates
            if r not in config.chargeback.rates and r.valid_from_date() <= _month_last_day(month)
        ]
        for rate in dropped:
            notices.append(
                f"rate {rate.partition}/{rate.gpu_model} {rate.price_per_gpu_hour} valid from {rate.valid_from} "
                f"priced closed month {month} and is no longer configured: {month} keeps it"
            )
    zones = sorted(
        {str(s.get("timezone")) for s in closed.values() if s.get("timezone")} - {config.timezone_name}
    )
    if zones:
        notices.append(
            f"site.timezone is {config.timezone_name}, closed months were cut in {', '.join(zones)}: "
            "they keep their edges; only open months are cut in the new zone"
        )
    return notices


def _month_last_day(month: str) -> date:
    return month_first_day(next_month(month)) - timedelta(days=1)


def assemble(
    month: str,
    config: ChargebackConfig,
    usage: Sequence[StatementLine],
    adjustments: Sequence[StatementLine],
    completed: Mapping[str, int],
    timezone: str = "",
) -> Statement:
    lines = (*usage, *adjustments)
    return Statement(
        month=month,
        currency=config.currency,
        lines=lines,
        totals=totals(lines, config.currency),
        completed_jobs=tuple(completed_job_costs(usage, completed, config.currency)),
        settings=settings_of(config, timezone),
    )


def months_adjusted_in(month: str, closed: Iterable[str]) -> list[str]:
    """Closed months before MONTH whose first open month after them is MONTH."""
    closed_set = set(closed)
    result = []
    for earlier in sorted(m for m in closed_set if m < month):
        following = next_month(earlier)
        while following in closed_set:
            following = next_month(following)
        if following == month:
            result.append(earlier)
    return result


def month_due_for_closing(config: Config, now: datetime) -> str | None:
    """The month the daemon should close at NOW: the previous one, from close_day_of_month on."""
    day = config.chargeback.close_day_of_month
    if day <= 0 or now.astimezone(config.zone).day < day:
        return None
    return previous_month(month_of(now, config.zone))


def check_month(month: str) -> str:
    try:
        first = month_first_day(month)
    except ValueError:
        raise ChargebackError(f"--month must be YYYY-MM, not '{month}'") from None
    canonical = f"{first.year:04d}-{first.month:02d}"
    if canonical != month:
        raise ChargebackError(f"--month must be YYYY-MM, not '{month}'")
    return month
