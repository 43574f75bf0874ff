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
import hashlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from typing import Any

from sqlalchemy import Engine, text

from slurmtel.access import EVERYTHING, Scope
from slurmtel.config import ChargebackConfig, ChargebackRate, Config
from slurmtel.errors import SlurmtelError
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
CLOSE_LOCK_KEY = 7_355_608_004  # pg_advisory_xact_lock key of closing a month

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
)
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


class ChargebackError(SlurmtelError):
    kind = "chargeback_error"


class MonthAlreadyClosed(ChargebackError):
    pass


# ---------------------------------------------------------------------------------------------
# pure part


@dataclass(frozen=True)
class UsageFigure:
    """Exact usage of one statement key in one month, before pricing (seconds as Decimal)."""

    cluster: str
    account: str
    user: str
    partition: str
    gpu_model: str
    gpu_seconds: Decimal
    # of gpu_seconds: attempts classed system_failure
    system_failure_gpu_seconds: Decimal = ZERO
    # Slurm's billing TRES x seconds (AllocTRES billing)
    billing_seconds: Decimal = ZERO
    system_failure_billing_seconds: Decimal = ZERO


Key = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class StatementLine:
    """One line of a statement; every figure already rounded."""

    kind: str  # "usage" (this month) or "adjustment" (a closed month's late data)
    for_month: str
    cluster: str
    account: str
    user: str
    partition: str
    gpu_model: str
    gpu_hours: Decimal
    billing_hours: Decimal
    priced: bool
    rate: Decimal | None
    rate_unit: str
    amount: Decimal | None
    waived_gpu_hours: Decimal
    waived_amount: Decimal | None
    billable_amount: Decimal | None
    unpriced_gpu_hours: Decimal

    @property
    def key(self) -> Key:
        return (self.cluster, self.account, self.user, self.partition, self.gpu_model)


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


def settings_of(config: ChargebackConfig) -> dict[str, Any]:
    """What a statement was computed with (stored with a closed statement)."""
    return {
        "currency": config.currency,
        "rounding": ROUNDING,
        "waive_system_failures": config.waive_system_failures,
        "use_billing_tres": config.use_billing_tres,
        "billing_rate": config.billing_rate,
        "rates": [asdict(rate) for rate in config.rates],
    }


def assemble(
    month: str,
    config: ChargebackConfig,
    usage: Sequence[StatementLine],
    adjustments: Sequence[StatementLine],
    completed: Mapping[str, int],
) -> Statement:
    lines = (*usage, *adjustments)
    return Statement(
        month=month,
        currency=config.currency,
        lines=lines,
        totals=totals(lines, config.currency),
        completed_jobs=tuple(completed_job_costs(usage, completed, config.currency)),
        settings=settings_of(config),
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
    t = statement.totals
    unit = statement.lines[0].rate_unit if statement.lines else _unit(statement.settings)
    return {
        "month": statement.month,
        "kind": "total",
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


def render_csv(statement: Statement) -> bytes:
    """Two sections: the lines with a totals line, a blank line, cost per completed job."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(LINE_COLUMNS)
    for record in statement_records(statement):
        writer.writerow([_text(record[c]) for c in LINE_COLUMNS])
    out.write("\n")
    writer.writerow(COMPLETED_COLUMNS)
    for cost in statement.completed_jobs:
        record = completed_record(statement.month, statement.currency, cost)
        writer.writerow([_text(record[c]) for c in COMPLETED_COLUMNS])
    return out.getvalue().encode("utf-8")


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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def line_to_data(line: StatementLine) -> dict[str, Any]:
    """A line as JSON data (decimals as strings) for the statement table."""
    return {k: _json(v) for k, v in asdict(line).items()}


def line_from_data(data: Mapping[str, Any]) -> StatementLine:
    def dec(name: str) -> Decimal | None:
        value = data.get(name)
        return None if value is None else Decimal(str(value))

    def req(name: str) -> Decimal:
        return dec(name) or ZERO

    return StatementLine(
        kind=str(data["kind"]),
        for_month=str(data["for_month"]),
        cluster=str(data["cluster"]),
        account=str(data["account"]),
        user=str(data["user"]),
        partition=str(data["partition"]),
        gpu_model=str(data["gpu_model"]),
        gpu_hours=req("gpu_hours"),
        billing_hours=req("billing_hours"),
        priced=bool(data["priced"]),
        rate=dec("rate"),
        rate_unit=str(data["rate_unit"]),
        amount=dec("amount"),
        waived_gpu_hours=req("waived_gpu_hours"),
        waived_amount=dec("waived_amount"),
        billable_amount=dec("billable_amount"),
        unpriced_gpu_hours=req("unpriced_gpu_hours"),
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


@dataclass(frozen=True)
class ClosedStatement:
    month: str
    closed_at: datetime
    closed_by: str
    csv: bytes
    json: bytes
    csv_sha256: str
    json_sha256: str
    lines: tuple[StatementLine, ...]
    totals: Mapping[str, Any]
    completed_jobs: tuple[Mapping[str, Any], ...]
    settings: Mapping[str, Any]

    def verified(self) -> ClosedStatement:
        """Self, after checking the stored bytes still match their checksums."""
        for name, data, digest in (("CSV", self.csv, self.csv_sha256), ("JSON", self.json, self.json_sha256)):
            if sha256(data) != digest:
                raise ChargebackError(
                    f"the stored {name} statement of {self.month} does not match its sha256 {digest}"
                )
        return self


def usage_lines(conn: Any, config: Config, month: str, now: datetime, scope: Scope) -> list[StatementLine]:
    from slurmtel.store.chargeback import usage_figures

    start, end = month_bounds(month, config.zone)
    figures = usage_figures(
        conn, start=start, end=end, now=now, scope=scope, billing=config.chargeback.use_billing_tres
    )
    return price_usage(figures, month, config.chargeback)


def build_statement(
    conn: Any, config: Config, month: str, now: datetime, scope: Scope = EVERYTHING
) -> Statement:
    """MONTH's statement computed now (an open month): usage, adjustments, cost per job."""
    from slurmtel.store.chargeback import closed_months, completed_jobs_by_account, get_statements

    check_month(month)
    start, end = month_bounds(month, config.zone)
    usage = usage_lines(conn, config, month, now, scope)
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
        current = usage_lines(conn, config, earlier, now, scope)
        adjustments += adjustment_lines(earlier, current, frozen, already)
    completed = completed_jobs_by_account(
        conn, start=start, end=end, scope=scope, billing=config.chargeback.use_billing_tres
    )
    return assemble(month, config.chargeback, usage, adjustments, completed)


def close_month(
    engine: Engine, config: Config, month: str, now: datetime, closed_by: str = ""
) -> ClosedStatement:
    """Freeze MONTH: compute its statement, store its exact bytes and checksums; once only."""
    from slurmtel.store.chargeback import get_statements, insert_statement

    check_month(month)
    start, end = month_bounds(month, config.zone)
    if now < end:
        raise ChargebackError(f"{month} has not ended yet (it ends {end.isoformat()}): it cannot be closed")
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CLOSE_LOCK_KEY})
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
        )
        insert_statement(conn, closed, start=start, end=end)
    return closed


def closed_statement(engine: Engine, month: str) -> ClosedStatement | None:
    """MONTH's stored statement (checksums verified), or None while the month is open."""
    from slurmtel.store.chargeback import get_statements

    check_month(month)
    with engine.connect() as conn:
        found = get_statements(conn, [month]).get(month)
    return found.verified() if found is not None else None


def close_due_month(engine: Engine, config: Config, now: datetime) -> ClosedStatement | None:
    """For the daemon: close the previous month once close_day_of_month has come."""
    month = month_due_for_closing(config, now)
    if month is None or closed_statement(engine, month) is not None:
        return None
    try:
        return close_month(engine, config, month, now, closed_by="slurmtel daemon")
    except MonthAlreadyClosed:
        return None
