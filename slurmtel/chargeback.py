"""Chargeback: monthly statements per account x user x partition x GPU model (DESIGN §4, §7).

The first part is pure money logic (no I/O, no clock): rate matching, pricing, rounding,
adjustments, totals and the exact bytes of a statement. The last part (`build_statement`,
`close_month`, `export_closed`, `close_due_month`) runs it against the database through
slurmtel.store.chargeback.

Money rules:
- Money is `Decimal` end to end: usage seconds come from SQL `numeric`, prices from strings in
  the config (TOML floats are binary), never a float.
- Each figure of a line is rounded ONCE, at the end, from exact values: amount =
  rate x gpu_seconds / 3600 rounded to the currency's minor unit (cents) with ROUND_HALF_EVEN
  (banker's rounding: halves go to the even cent, so rounding errors do not drift one way);
  waived_amount likewise; billable_amount = amount - waived_amount (of the rounded figures, so
  every line adds up). Hours are shown to 4 decimals (HOURS), also ROUND_HALF_EVEN.
- Totals are the sums of the rounded lines (a spreadsheet summing the column gets the total).
- The rate of a month is the one valid on the month's first day: among the rates whose
  valid_from <= that day, the most specific match wins (partition+model > partition+* >
  *+model > *+*), and among equally specific ones the latest valid_from. A rate change in
  the middle of a month applies from the next month on.
- Usage no rate matches is an unpriced line (priced false, rate and amounts null), never
  charged zero; totals show unpriced GPU-hours apart.
- Attempts classed system_failure are waived when chargeback.waive_system_failures is true.
- Adjustments: data that arrives for a closed month M is charged in the first month after M
  that is still open: adjustment = M computed now - what M's statement froze - adjustments
  for M already frozen into later closed statements.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import ChargebackConfig, ChargebackRate, Config
from slurmtel.errors import ChargebackError
from slurmtel.rows import (
    ClosedStatement,
    Key,
    StatementLine,
    UsageFigure,
    sha256,
)
from slurmtel.rows import (
    line_from_data as line_from_data,
)
from slurmtel.rows import (
    line_to_data as line_to_data,
)
from slurmtel.store.locks import CLOSE_LOCK_KEY, advisory_xact_lock
from slurmtel.timeparse import month_bounds

ROUNDING = ROUND_HALF_EVEN
HOURS = Decimal("0.0001")
ZERO = Decimal(0)
SECONDS_PER_HOUR = Decimal(3600)
# ISO 4217 minor units where they are not 2
MINOR_UNITS = {
    "BHD": 3,
    "BIF": 0,
    "CLP": 0,
    "DJF": 0,
    "GNF": 0,
    "IQD": 3,
    "ISK": 0,
    "JOD": 3,
    "JPY": 0,
    "KMF": 0,
    "KRW": 0,
    "KWD": 3,
    "LYD": 3,
    "OMR": 3,
    "PYG": 0,
    "RWF": 0,
    "TND": 3,
    "UGX": 0,
    "UYI": 0,
    "VND": 0,
    "VUV": 0,
    "XAF": 0,
    "XOF": 0,
    "XPF": 0,
}
RATE_UNIT_GPU = "gpu_hour"
RATE_UNIT_BILLING = "billing_hour"

# The statement's columns, in order (README "## Chargeback" documents each).
LINE_COLUMNS = (
    "month",
    "kind",
    "for_month",
    "cluster",
    "account",
    "user",
    "partition",
    "gpu_model",
    "gpu_hours",
    "billing_hours",
    "priced",
    "rate",
    "rate_unit",
    "amount",
    "waived_gpu_hours",
    "waived_amount",
    "billable_amount",
    "unpriced_gpu_hours",
    "currency",
    "cause",
)
# `--by parent|top` (and `--by account`): the account each line rolls up to, and subtotal rows
ROLLUP_COLUMNS = ("rollup_level", "rollup_account", *LINE_COLUMNS)
ROLLUP_LEVELS = ("account", "parent", "top")
COMPLETED_COLUMNS = (
    "month",
    "account",
    "completed_jobs",
    "gpu_hours",
    "amount",
    "billable_amount",
    "unpriced_gpu_hours",
    "cost_per_completed_job",
    "billable_per_completed_job",
    "currency",
)


class MonthAlreadyClosed(ChargebackError):
    pass


# ---------------------------------------------------------------------------------------------
# pure part


@dataclass(frozen=True)
class Totals:
    gpu_hours: Decimal
    billing_hours: Decimal
    amount: Decimal
    waived_gpu_hours: Decimal
    waived_amount: Decimal
    billable_amount: Decimal
    unpriced_gpu_hours: Decimal

    @property
    def priced(self) -> bool:
        return self.unpriced_gpu_hours == 0


@dataclass(frozen=True)
class CompletedJobCost:
    """Cost per completed job of one account (this month's usage, adjustments left out)."""

    account: str
    completed_jobs: int
    gpu_hours: Decimal
    amount: Decimal | None
    billable_amount: Decimal | None
    unpriced_gpu_hours: Decimal
    cost_per_completed_job: Decimal | None
    billable_per_completed_job: Decimal | None


@dataclass(frozen=True)
class Statement:
    month: str
    currency: str
    lines: tuple[StatementLine, ...]
    totals: Totals
    completed_jobs: tuple[CompletedJobCost, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    status: str = "open"
    closed_at: datetime | None = None


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


def month_first_day(month: str) -> date:
    year, mon = month.split("-")
    return date(int(year), int(mon), 1)


def next_month(month: str) -> str:
    first = month_first_day(month)
    return f"{first.year + (first.month == 12):04d}-{first.month % 12 + 1:02d}"


def previous_month(month: str) -> str:
    first = month_first_day(month)
    return f"{first.year - (first.month == 1):04d}-{(first.month - 2) % 12 + 1:02d}"


def month_of(moment: datetime, config: Config) -> str:
    local = moment.astimezone(config.zone)
    return f"{local.year:04d}-{local.month:02d}"


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
        {str(s.get("timezone")) for s in closed.values() if s.get("timezone")} - {config.site.timezone}
    )
    if zones:
        notices.append(
            f"site.timezone is {config.site.timezone}, closed months were cut in {', '.join(zones)}: "
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


# --- the bytes of a statement -----------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json(value: Any) -> Any:
    # money and hours stay exact: decimal strings, not binary floats
    return str(value) if isinstance(value, Decimal) else value


def line_record(month: str, currency: str, line: StatementLine) -> dict[str, Any]:
    record = {"month": month, "currency": currency, **asdict(line)}
    return {c: record[c] for c in LINE_COLUMNS}


def totals_record(statement: Statement) -> dict[str, Any]:
    return _summary_record(statement, "total", statement.totals, statement.lines)


def _summary_record(
    statement: Statement, kind: str, t: Totals, lines: Sequence[StatementLine]
) -> dict[str, Any]:
    unit = lines[0].rate_unit if lines else _unit(statement.settings)
    return {
        "month": statement.month,
        "kind": kind,
        "for_month": "",
        "cluster": "",
        "account": "",
        "user": "",
        "partition": "",
        "gpu_model": "",
        "gpu_hours": t.gpu_hours,
        "billing_hours": t.billing_hours,
        "priced": t.priced,
        "rate": None,
        "rate_unit": unit,
        "amount": t.amount,
        "waived_gpu_hours": t.waived_gpu_hours,
        "waived_amount": t.waived_amount,
        "billable_amount": t.billable_amount,
        "unpriced_gpu_hours": t.unpriced_gpu_hours,
        "currency": statement.currency,
        "cause": "",
    }


def _unit(settings: Mapping[str, Any]) -> str:
    return RATE_UNIT_BILLING if settings.get("use_billing_tres") else RATE_UNIT_GPU


def completed_record(month: str, currency: str, cost: CompletedJobCost) -> dict[str, Any]:
    record = {"month": month, "currency": currency, **asdict(cost)}
    return {c: record[c] for c in COMPLETED_COLUMNS}


def statement_records(statement: Statement) -> list[dict[str, Any]]:
    """The lines then the totals line, as column -> value."""
    lines = [line_record(statement.month, statement.currency, line) for line in statement.lines]
    return [*lines, totals_record(statement)]


def records_csv(records: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    """One flat table: one header, one row per record (a spreadsheet imports it as is)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([_text(record[c]) for c in columns])
    return out.getvalue().encode("utf-8")


def render_csv(statement: Statement) -> bytes:
    """The statement as one flat table: its lines, then the `total` row (kind marks it)."""
    return records_csv(statement_records(statement), LINE_COLUMNS)


def render_completed_csv(statement: Statement) -> bytes:
    """Cost per completed job per account, one flat table of its own."""
    return records_csv(
        (completed_record(statement.month, statement.currency, c) for c in statement.completed_jobs),
        COMPLETED_COLUMNS,
    )


def rollup_account(account: str, level: str, parents: Mapping[str, frozenset[str]]) -> str:
    """The account ACCOUNT rolls up to at LEVEL: itself, its parent, or its top-level account
    (the one right below Slurm's `root`). An account the tree does not know is its own parent
    and top; where an account has parents in several clusters, the first by name."""
    if level == "account":
        return account

    def parent_of(name: str) -> str | None:
        found = sorted(parents.get(name, ()))
        return found[0] if found and found[0] != "root" else None

    if level == "parent":
        return parent_of(account) or account
    seen = {account}
    current = account
    while (up := parent_of(current)) is not None and up not in seen:
        seen.add(up)
        current = up
    return current


def rollup_records(
    statement: Statement, level: str, parents: Mapping[str, frozenset[str]]
) -> list[dict[str, Any]]:
    """The statement's lines grouped by the account they roll up to at LEVEL, each group
    followed by its `subtotal` row, then the `total` row. Subtotals are sums of the rounded
    lines, so they add up to the total exactly."""
    if level not in ROLLUP_LEVELS:
        raise ChargebackError(f"--by must be one of {', '.join(ROLLUP_LEVELS)}, not '{level}'")
    groups: dict[str, list[StatementLine]] = {}
    for line in statement.lines:
        groups.setdefault(rollup_account(line.account, level, parents), []).append(line)
    records: list[dict[str, Any]] = []
    for group in sorted(groups):
        lines = groups[group]
        for line in lines:
            records.append(
                {
                    "rollup_level": level,
                    "rollup_account": group,
                    **line_record(statement.month, statement.currency, line),
                }
            )
        sub = totals(lines, statement.currency)
        records.append(
            {
                "rollup_level": level,
                "rollup_account": group,
                **_summary_record(statement, "subtotal", sub, lines),
                "account": group,
            }
        )
    records.append({"rollup_level": level, "rollup_account": "", **totals_record(statement)})
    return records


def render_json(statement: Statement) -> bytes:
    document = {
        "month": statement.month,
        "status": statement.status,
        "closed_at": statement.closed_at.isoformat() if statement.closed_at else None,
        "currency": statement.currency,
        "rounding": ROUNDING,
        "lines": [{k: _json(v) for k, v in r.items()} for r in statement_records(statement)[:-1]],
        "totals": {k: _json(v) for k, v in totals_record(statement).items()},
        "completed_jobs": [
            {k: _json(v) for k, v in completed_record(statement.month, statement.currency, c).items()}
            for c in statement.completed_jobs
        ],
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def statement_of_closed(stored: ClosedStatement) -> Statement:
    """A closed statement's figures as a Statement (for views derived from it: roll-ups,
    parquet); its stored bytes stay the statement of record."""
    currency = str(stored.settings.get("currency", "EUR"))
    return Statement(
        month=stored.month,
        currency=currency,
        lines=stored.lines,
        totals=totals(stored.lines, currency),
        completed_jobs=tuple(
            CompletedJobCost(
                account=str(c["account"]),
                completed_jobs=int(c["completed_jobs"]),
                gpu_hours=Decimal(str(c["gpu_hours"])),
                amount=None if c.get("amount") is None else Decimal(str(c["amount"])),
                billable_amount=None
                if c.get("billable_amount") is None
                else Decimal(str(c["billable_amount"])),
                unpriced_gpu_hours=Decimal(str(c["unpriced_gpu_hours"])),
                cost_per_completed_job=None
                if c.get("cost_per_completed_job") is None
                else Decimal(str(c["cost_per_completed_job"])),
                billable_per_completed_job=None
                if c.get("billable_per_completed_job") is None
                else Decimal(str(c["billable_per_completed_job"])),
            )
            for c in stored.completed_jobs
        ),
        settings=stored.settings,
        status="closed",
        closed_at=stored.closed_at,
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
    return previous_month(month_of(now, config))


def check_month(month: str) -> str:
    try:
        first = month_first_day(month)
    except ValueError:
        raise ChargebackError(f"--month must be YYYY-MM, not '{month}'") from None
    canonical = f"{first.year:04d}-{first.month:02d}"
    if canonical != month:
        raise ChargebackError(f"--month must be YYYY-MM, not '{month}'")
    return month


# ---------------------------------------------------------------------------------------------
# against the database


def usage_lines(
    conn: Any,
    pricing: ChargebackConfig,
    month: str,
    bounds: tuple[datetime, datetime],
    now: datetime,
    scope: Scope,
) -> list[StatementLine]:
    """MONTH's usage in BOUNDS, priced with PRICING."""
    from slurmtel.store.chargeback import usage_figures

    start, end = bounds
    figures = usage_figures(
        conn, start=start, end=end, now=now, scope=scope, billing=pricing.use_billing_tres
    )
    return price_usage(figures, month, pricing)


def closed_usage_now(conn: Any, frozen: ClosedStatement, now: datetime, scope: Scope) -> list[StatementLine]:
    """A closed month's usage as the data stands NOW, cut at the edges and priced with the
    rates it was closed with: only usage that changed since can differ from its statement."""
    assert frozen.month_start_at is not None and frozen.month_end_at is not None
    bounds = (frozen.month_start_at, frozen.month_end_at)
    return usage_lines(conn, frozen_pricing(frozen.settings), frozen.month, bounds, now, scope)


def build_statement(
    conn: Any, config: Config, month: str, now: datetime, scope: Scope = EVERYTHING
) -> Statement:
    """MONTH's statement computed now (an open month): usage, adjustments, cost per job."""
    from slurmtel.store.chargeback import closed_months, completed_jobs_by_account, get_statements

    check_month(month)
    start, end = month_bounds(month, config.zone)
    usage = usage_lines(conn, config.chargeback, month, (start, end), now, scope)
    adjustments: list[StatementLine] = []
    closed = closed_months(conn)
    for earlier in months_adjusted_in(month, closed):
        statements = get_statements(conn, [m for m in closed if m >= earlier])
        frozen_statement = statements[earlier]
        if frozen_statement.settings.get("currency") != config.chargeback.currency:
            raise ChargebackError(
                f"{earlier} was closed in {frozen_statement.settings.get('currency')}, the config says "
                f"{config.chargeback.currency}: adjustments cannot mix currencies"
            )
        frozen = [line for line in frozen_statement.lines if line.kind == "usage"]
        already = [
            line
            for later, s in statements.items()
            if later > earlier
            for line in s.lines
            if line.kind == "adjustment" and line.for_month == earlier
        ]
        current = closed_usage_now(conn, frozen_statement, now, scope)
        adjustments += adjustment_lines(earlier, current, frozen, already)
    completed = completed_jobs_by_account(
        conn, start=start, end=end, scope=scope, billing=config.chargeback.use_billing_tres
    )
    return assemble(month, config.chargeback, usage, adjustments, completed, config.site.timezone)


DIFF_COLUMNS = (
    "month",
    "cluster",
    "account",
    "user",
    "partition",
    "gpu_model",
    "closed_gpu_hours",
    "now_gpu_hours",
    "closed_rate",
    "now_rate",
    "closed_billable_amount",
    "now_billable_amount",
    "billable_amount_change",
    "currency",
)


def diff_records(
    month: str, currency: str, closed: Sequence[StatementLine], now: Sequence[StatementLine]
) -> list[dict[str, Any]]:
    """Per key, the closed statement's usage line beside the same month re-priced today;
    keys whose hours, rate and billable amount are all unchanged are left out."""
    by_key: dict[Key, list[StatementLine | None]] = {}
    for line in closed:
        by_key.setdefault(line.key, [None, None])[0] = line
    for line in now:
        by_key.setdefault(line.key, [None, None])[1] = line
    records = []
    for key in sorted(by_key):
        before, after = by_key[key]
        figures = [
            (line.gpu_hours, line.rate, line.billable_amount) if line is not None else (ZERO, None, None)
            for line in (before, after)
        ]
        if figures[0] == figures[1]:
            continue
        change = (figures[1][2] or ZERO) - (figures[0][2] or ZERO)
        records.append(
            {
                "month": month,
                **dict(zip(("cluster", "account", "user", "partition", "gpu_model"), key, strict=True)),
                "closed_gpu_hours": figures[0][0],
                "now_gpu_hours": figures[1][0],
                "closed_rate": figures[0][1],
                "now_rate": figures[1][1],
                "closed_billable_amount": figures[0][2],
                "now_billable_amount": figures[1][2],
                "billable_amount_change": _clean(change),
                "currency": currency,
            }
        )
    return records


def diff_closed_month(conn: Any, config: Config, month: str, now: datetime) -> list[dict[str, Any]]:
    """What would change if closed MONTH were re-priced today: today's rates, time zone and
    data against its frozen usage lines. Changes nothing."""
    from slurmtel.store.chargeback import get_statements

    frozen = get_statements(conn, [check_month(month)]).get(month)
    if frozen is None:
        raise ChargebackError(
            f"{month} is not closed: --diff compares a closed statement with today's pricing"
        )
    bounds = month_bounds(month, config.zone)
    current = usage_lines(conn, config.chargeback, month, bounds, now, EVERYTHING)
    closed_usage = [line for line in frozen.lines if line.kind == "usage"]
    return diff_records(month, config.chargeback.currency, closed_usage, current)


def close_month(
    engine: Engine, config: Config, month: str, now: datetime, closed_by: str = ""
) -> ClosedStatement:
    """Freeze MONTH: compute its statement, store its exact bytes and checksums; once only."""
    from slurmtel.store.chargeback import get_statements, insert_audit, insert_statement

    check_month(month)
    start, end = month_bounds(month, config.zone)
    if now < end:
        raise ChargebackError(f"{month} has not ended yet (it ends {end.isoformat()}): it cannot be closed")
    with engine.begin() as conn:
        advisory_xact_lock(conn, CLOSE_LOCK_KEY)
        existing = get_statements(conn, [month]).get(month)
        if existing is not None:
            raise MonthAlreadyClosed(
                f"{month} is already closed (at {existing.closed_at.isoformat()}, CSV sha256 "
                f"{existing.csv_sha256}); data that arrives for it appears as adjustments in the "
                "next open month"
            )
        statement = replace(build_statement(conn, config, month, now), status="closed", closed_at=now)
        csv_bytes, json_bytes = render_csv(statement), render_json(statement)
        closed = ClosedStatement(
            month=month,
            closed_at=now,
            closed_by=closed_by,
            csv=csv_bytes,
            json=json_bytes,
            csv_sha256=sha256(csv_bytes),
            json_sha256=sha256(json_bytes),
            lines=statement.lines,
            totals={k: _json(v) for k, v in totals_record(statement).items()},
            completed_jobs=tuple(
                {k: _json(v) for k, v in completed_record(month, statement.currency, c).items()}
                for c in statement.completed_jobs
            ),
            settings=statement.settings,
            month_start_at=start,
            month_end_at=end,
        )
        insert_statement(conn, closed, start=start, end=end)
        insert_audit(conn, at=now, actor=closed_by, action="close", month=month, csv_sha256=closed.csv_sha256)
    return closed


def void_month(engine: Engine, month: str, now: datetime, voided_by: str, reason: str) -> ClosedStatement:
    """Void closed MONTH: its statement is kept, bytes and all, among the voided ones, and
    the month may be closed again. Only the latest closed month: a later closed statement may
    hold adjustments computed against this one (void that one first)."""
    from slurmtel.store.chargeback import closed_months, get_statements, insert_audit, move_to_voided

    check_month(month)
    if not reason.strip():
        raise ChargebackError("--void needs --reason: why the statement is voided is kept with it")
    with engine.begin() as conn:
        advisory_xact_lock(conn, CLOSE_LOCK_KEY)
        stored = get_statements(conn, [month]).get(month)
        if stored is None:
            raise ChargebackError(f"{month} is not closed: there is no statement to void")
        later = [m for m in closed_months(conn) if m > month]
        if later:
            raise ChargebackError(
                f"{month} cannot be voided while later months are closed ({', '.join(later)}): their "
                "adjustments were computed against it; void them first, latest first"
            )
        move_to_voided(conn, month, voided_at=now, voided_by=voided_by, reason=reason.strip())
        insert_audit(
            conn,
            at=now,
            actor=voided_by,
            action="void",
            month=month,
            csv_sha256=stored.csv_sha256,
            reason=reason,
        )
    return stored


def closed_statement(engine: Engine, month: str) -> ClosedStatement | None:
    """MONTH's stored statement (checksums verified), or None while the month is open."""
    from slurmtel.store.chargeback import get_statements

    check_month(month)
    with engine.connect() as conn:
        found = get_statements(conn, [month]).get(month)
    return found.verified() if found is not None else None


def close_due_month(engine: Engine, config: Config, now: datetime) -> ClosedStatement | None:
    """For the daemon: close the previous month once close_day_of_month has come. A month
    finance voided is closed again only by hand (after whatever was wrong is fixed)."""
    from slurmtel.store.chargeback import voided_months

    month = month_due_for_closing(config, now)
    if month is None or closed_statement(engine, month) is not None:
        return None
    with engine.connect() as conn:
        if month in voided_months(conn):
            return None
    try:
        return close_month(engine, config, month, now, closed_by="slurmtel daemon")
    except MonthAlreadyClosed:
        return None
