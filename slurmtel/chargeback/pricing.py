"""Chargeback's money logic (pure: no I/O, no clock): rate matching, pricing, rounding,
adjustments, totals, the pricing a statement freezes, and which month is due."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import date, datetime, timedelta
from decimal import Decimal, localcontext
from typing import Any

from slurmtel.chargeback.model import (
    BILLED_UNITS,
    FORMAT_VERSION,
    HOURS,
    KILOGRAMS,
    MINOR_UNITS,
    QUANTITY,
    ROUNDING,
    SECONDS,
    SECONDS_PER_HOUR,
    TRES_BILLING,
    TRES_ENERGY,
    TRES_GPU,
    ZERO,
    CompletedJobCost,
    Statement,
    Totals,
    UnitTotals,
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
    """rate (per hour) x seconds, rounded once to the currency's minor unit (format 1's rule,
    and budgets' committed money)."""
    with localcontext() as ctx:
        ctx.prec = 50
        return _round(rate * seconds / SECONDS_PER_HOUR, money_quantum(currency))


def billed_unit(tres: str) -> str:
    return BILLED_UNITS[tres][0]


def quantity(tres: str, tres_seconds: Decimal) -> Decimal:
    """TRES-seconds in the TRES's billed unit (GPU-hours, GiB-hours, ...), to 6 decimals."""
    with localcontext() as ctx:
        ctx.prec = 50
        return _round(tres_seconds / BILLED_UNITS[tres][1], QUANTITY)


def amount_of(rate: Decimal, billed_quantity: Decimal, currency: str) -> Decimal:
    """rate x billed_quantity, rounded once to the currency's minor unit: a ledger that
    multiplies a line's rate by its billed_quantity gets its amount."""
    with localcontext() as ctx:
        ctx.prec = 50
        return _round(rate * billed_quantity, money_quantum(currency))


def match_rate(
    rates: Sequence[ChargebackRate], partition: str, gpu_model: str, on: date, tres: str = TRES_GPU
) -> ChargebackRate | None:
    """The rate of TRES for (PARTITION, GPU_MODEL) on day ON: most specific first, then latest."""
    model = gpu_model.lower()
    best: tuple[int, date] | None = None
    chosen = None
    for rate in rates:
        if rate.tres() != tres:
            continue
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


def priced_tres(config: ChargebackConfig) -> tuple[str, ...]:
    """The TRES a statement has lines for: Slurm's billing TRES (use_billing_tres; GPU usage
    without one is listed unpriced), else gres/gpu (always: GPU usage is never left off) and
    every TRES a rate prices."""
    energy = (TRES_ENERGY,) if config.price_per_kwh.strip() else ()
    if config.use_billing_tres:
        return (TRES_BILLING, TRES_GPU, *energy)
    return (TRES_GPU, *sorted({rate.tres() for rate in config.rates} - {TRES_GPU}), *energy)


def co2e_of(kwh: Decimal, config: ChargebackConfig) -> Decimal | None:
    """kWh x the grid's carbon intensity (g CO2e per kWh), in kg to the gram; None unset."""
    if not config.carbon_grams_per_kwh.strip():
        return None
    with localcontext() as ctx:
        ctx.prec = 50
        return _round(kwh * Decimal(config.carbon_grams_per_kwh) / 1000, KILOGRAMS)


def price_usage(figures: Iterable[UsageFigure], month: str, config: ChargebackConfig) -> list[StatementLine]:
    """Usage lines of MONTH, priced with the rates valid on its first day, sorted by key.

    Each line's figures come from its exact TRES-seconds: allocated_tres_seconds rounded to
    the hundredth, billed_quantity (in the TRES's billed unit) to 6 decimals, amount = rate x
    billed_quantity rounded once to the minor unit; waived likewise; billable = amount - waived.
    """
    first_day = month_first_day(month)
    currency = config.currency
    lines = []
    for f in sorted(figures, key=lambda f: (f.cluster, f.account, f.user, f.partition, f.gpu_model, f.tres)):
        waived = f.system_failure_tres_seconds if config.waive_system_failures else ZERO
        rate: Decimal | None = None
        if f.tres == TRES_ENERGY:
            rate = Decimal(config.price_per_kwh)
        elif config.use_billing_tres:
            # GPU usage of attempts without a billing TRES is listed, unpriced: not free
            rate = Decimal(config.billing_rate) if f.tres == TRES_BILLING else None
        else:
            matched = match_rate(config.rates, f.partition, f.gpu_model, first_day, f.tres)
            rate = matched.price_of(f.tres) if matched is not None else None
        billed, waived_billed = quantity(f.tres, f.tres_seconds), quantity(f.tres, waived)
        amount = waived_amount = billable = None
        if rate is not None:
            amount = amount_of(rate, billed, currency)
            waived_amount = amount_of(rate, waived_billed, currency)
            billable = amount - waived_amount
        lines.append(
            StatementLine(
                kind="usage",
                adjusted_month="",
                cluster=f.cluster,
                account=f.account,
                user=f.user,
                partition=f.partition,
                tres=f.tres,
                gpu_model=f.gpu_model,
                # energy is consumed joules, not a count held over time: no TRES-seconds
                allocated_tres_seconds=_round(ZERO if f.tres == TRES_ENERGY else f.tres_seconds, SECONDS),
                waived_tres_seconds=_round(ZERO if f.tres == TRES_ENERGY else waived, SECONDS),
                billed_quantity=billed,
                waived_quantity=waived_billed,
                billed_unit=billed_unit(f.tres),
                priced=rate is not None,
                rate=rate,
                amount=amount,
                waived_amount=waived_amount,
                billable_amount=billable,
                co2e_kilograms=co2e_of(billed, config) if f.tres == TRES_ENERGY else None,
            )
        )
    return lines


# the figures of a line that add up over lines of one key (quantities of one unit)
_SUMMED = (
    "allocated_tres_seconds",
    "waived_tres_seconds",
    "billed_quantity",
    "waived_quantity",
    "amount",
    "waived_amount",
    "billable_amount",
    "co2e_kilograms",
)


def _sum(lines: Iterable[StatementLine], name: str) -> Decimal:
    total = ZERO
    for line in lines:
        value = getattr(line, name)
        if value is not None:
            total += value
    return total


def adjustment_lines(
    adjusted_month: str,
    current: Sequence[StatementLine],
    frozen: Sequence[StatementLine],
    already: Sequence[StatementLine],
) -> list[StatementLine]:
    """Lines charging ADJUSTED_MONTH's late changes: current - frozen - already adjusted.

    CURRENT: ADJUSTED_MONTH's usage lines computed now (priced as its statement was); FROZEN:
    the usage lines its closed statement holds; ALREADY: adjustment lines for it in later
    closed statements. Keys whose every figure nets to zero give no line.
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
                adjusted_month=adjusted_month,
                cause=adjustment_cause(adjusted_month, delta["allocated_tres_seconds"], reference.tres),
                rate=reference.rate if reference.priced else None,
                priced=priced,
                allocated_tres_seconds=_clean(delta["allocated_tres_seconds"]),
                waived_tres_seconds=_clean(delta["waived_tres_seconds"]),
                billed_quantity=_clean(delta["billed_quantity"]),
                waived_quantity=_clean(delta["waived_quantity"]),
                amount=_clean(delta["amount"]) if priced else None,
                waived_amount=_clean(delta["waived_amount"]) if priced else None,
                billable_amount=_clean(delta["billable_amount"]) if priced else None,
                co2e_kilograms=_clean(delta["co2e_kilograms"])
                if reference.co2e_kilograms is not None
                else None,
            )
        )
    return result


def adjustment_cause(adjusted_month: str, tres_seconds: Decimal, tres: str) -> str:
    """Why an adjustment line exists. Closed months are re-priced with their own frozen rates
    and edges, so only usage that changed after the close makes one."""
    if tres_seconds > 0:
        return f"usage of {adjusted_month} that arrived after it was closed: {_clean(tres_seconds):+} {tres}-seconds"
    if tres_seconds < 0:
        return f"usage of {adjusted_month} revised down after it was closed: {_clean(tres_seconds):+} {tres}-seconds"
    return f"waiver or pricing basis of {adjusted_month} usage changed after it was closed"


def _clean(value: Decimal) -> Decimal:
    return value.copy_abs() if value.is_zero() else value


def _unit_totals(unit: str, lines: Sequence[StatementLine], money: Decimal) -> UnitTotals:
    unpriced = [line for line in lines if not line.priced]
    return UnitTotals(
        billed_unit=unit,
        line_count=len(lines),
        unpriced_line_count=len(unpriced),
        allocated_tres_seconds=_round(_sum(lines, "allocated_tres_seconds"), SECONDS),
        billed_quantity=_round(_sum(lines, "billed_quantity"), QUANTITY),
        waived_quantity=_round(_sum(lines, "waived_quantity"), QUANTITY),
        unpriced_quantity=_round(_sum(unpriced, "billed_quantity"), QUANTITY),
        amount=_round(_sum(lines, "amount"), money),
        waived_amount=_round(_sum(lines, "waived_amount"), money),
        billable_amount=_round(_sum(lines, "billable_amount"), money),
        co2e_kilograms=_round(_sum(lines, "co2e_kilograms"), KILOGRAMS)
        if any(line.co2e_kilograms is not None for line in lines)
        else None,
    )


def totals(lines: Sequence[StatementLine], currency: str) -> Totals:
    """Sums of the rounded lines (usage and adjustments), per billed unit and in money (money
    of unpriced lines counts 0); quantities of different units are never added."""
    money = money_quantum(currency)
    units = sorted({line.billed_unit for line in lines})
    return Totals(
        amount=_round(_sum(lines, "amount"), money),
        waived_amount=_round(_sum(lines, "waived_amount"), money),
        billable_amount=_round(_sum(lines, "billable_amount"), money),
        line_count=len(lines),
        unpriced_line_count=sum(1 for line in lines if not line.priced),
        by_unit=tuple(
            _unit_totals(u, [line for line in lines if line.billed_unit == u], money) for u in units
        ),
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
                allocated_gpu_seconds=_round(
                    _sum([line for line in mine if line.tres == TRES_GPU], "allocated_tres_seconds"), SECONDS
                ),
                amount=amount,
                billable_amount=billable,
                unpriced_line_count=sum(1 for line in mine if not line.priced),
                cost_per_completed_job=_round(amount / jobs, quantum)
                if jobs and amount is not None
                else None,
                billable_per_completed_job=(
                    _round(billable / jobs, quantum) if jobs and billable is not None else None
                ),
            )
        )
    return result


def rate_data(rate: ChargebackRate) -> dict[str, str]:
    """A rate as a closed statement's settings keep it: its set fields only, so a rate written
    before a field existed compares equal to the same rate read today."""
    return {k: v for k, v in asdict(rate).items() if v != ""}


def settings_of(config: ChargebackConfig, timezone: str = "") -> dict[str, Any]:
    """What a statement was computed with (stored with a closed statement)."""
    return {
        "format_version": FORMAT_VERSION,
        "timezone": timezone,
        "currency": config.currency,
        "rounding": ROUNDING,
        "waive_system_failures": config.waive_system_failures,
        "use_billing_tres": config.use_billing_tres,
        "billing_rate": config.billing_rate,
        "rates": [rate_data(rate) for rate in config.rates],
        "price_per_kwh": config.price_per_kwh,
        "carbon_grams_per_kwh": config.carbon_grams_per_kwh,
    }


def settings_format(settings: Mapping[str, Any]) -> int:
    """The statement format a closed statement's settings were priced in (1: before format 2)."""
    return int(settings.get("format_version", 1))


def frozen_pricing(settings: Mapping[str, Any]) -> ChargebackConfig:
    """The pricing a closed statement was computed with, from its stored settings: a closed
    month is only ever priced with these, whatever the config says today."""
    return ChargebackConfig(
        currency=str(settings.get("currency", "EUR")),
        waive_system_failures=bool(settings.get("waive_system_failures", True)),
        use_billing_tres=bool(settings.get("use_billing_tres", False)),
        billing_rate=str(settings.get("billing_rate", "")),
        rates=[ChargebackRate(**rate) for rate in settings.get("rates", [])],
        price_per_kwh=str(settings.get("price_per_kwh", "")),
        carbon_grams_per_kwh=str(settings.get("carbon_grams_per_kwh", "")),
    )


def _rate_text(rate: ChargebackRate) -> str:
    tres = rate.tres()
    what = "" if tres == TRES_GPU else f"{tres} "
    return f"rate {what}{rate.partition}/{rate.gpu_model} {rate.price_of(tres)}"


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
            if rate not in frozen_pricing(settings).rates and rate.valid_from_date() <= _month_last_day(month)
        ]
        if covered:
            notices.append(
                f"{_rate_text(rate)} valid from "
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
                f"{_rate_text(rate)} valid from {rate.valid_from} "
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
    bounds: tuple[datetime, datetime] | None = None,
) -> Statement:
    lines = (*usage, *adjustments)
    return Statement(
        month=month,
        currency=config.currency,
        lines=lines,
        totals=totals(lines, config.currency),
        completed_jobs=tuple(completed_job_costs(usage, completed, config.currency)),
        settings=settings_of(config, timezone),
        month_start_at=bounds[0] if bounds else None,
        month_end_at=bounds[1] if bounds else None,
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
