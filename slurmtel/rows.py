"""Plain row types that cross the store's wall: the store returns them, the reports, budgets
and chargeback shape them.

They live here, not with the code that shapes them, because the store may import no report,
budget or chargeback module (tests/test_layers.py); and here they import nothing of slurmtel but
its errors and slurmtel.jobrows (the job view's rows, apart so that `slurmtel job` loads them
alone; re-exported here). The modules that use them re-export them (`from slurmtel.chargeback import
UsageFigure` keeps working).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from slurmtel.errors import ChargebackError

# re-exported: the job view's rows live in slurmtel.jobrows
from slurmtel.jobrows import GpuFigures as GpuFigures
from slurmtel.jobrows import UtilWindow as UtilWindow

ZERO = Decimal(0)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(value: Any) -> Any:
    # money and hours stay exact: decimal strings, not binary floats
    return str(value) if isinstance(value, Decimal) else value


# --- a job's view: slurmtel.jobrows (the job command loads that module alone) ------------------


# --- budgets (store/budget.py -> budget.py) -----------------------------------------------------


@dataclass(frozen=True)
class MonthSlice:
    """The part of a period in one calendar month, up to AT: [start_at, end_at)."""

    month: str  # YYYY-MM
    start_at: datetime
    end_at: datetime


@dataclass(frozen=True)
class RunningAttempt:
    """An attempt running at AT, with what it may still use."""

    account: str
    partition: str
    gpu_model: str  # as chargeback keys it: 'unknown' when untyped
    alloc_gpus: int
    billing: Decimal  # Slurm's billing TRES of the allocation (0 when none)
    start_at: datetime
    time_limit_seconds: int | None


# --- chargeback (store/chargeback.py -> chargeback) ---------------------------------------------


@dataclass(frozen=True)
class UsageFigure:
    """Exact usage of one TRES of one statement key in one month, before pricing: Slurm's
    count of the TRES x seconds inside the month (Decimal)."""

    cluster: str
    account: str
    user: str
    partition: str
    gpu_model: str
    # the TRES as Slurm names it: gres/gpu, cpu, mem (megabytes), node, billing
    tres: str
    tres_seconds: Decimal
    # of tres_seconds: attempts classed system_failure
    system_failure_tres_seconds: Decimal = ZERO


@dataclass(frozen=True)
class LegacyUsageFigure:
    """A key's usage as statement format 1 priced it (GPU- and billing-seconds side by side):
    what adjustments for a month closed in format 1 are computed from."""

    cluster: str
    account: str
    user: str
    partition: str
    gpu_model: str
    gpu_seconds: Decimal
    system_failure_gpu_seconds: Decimal = ZERO
    billing_seconds: Decimal = ZERO
    system_failure_billing_seconds: Decimal = ZERO


# (cluster, account, user, partition, gpu_model, tres)
Key = tuple[str, str, str, str, str, str]


@dataclass(frozen=True)
class StatementLine:
    """One line of a statement (format 2); every figure already rounded.

    billed_quantity is allocated_tres_seconds in billed_unit (gpu_hour, cpu_hour, gib_hour,
    node_hour, billing_hour) and amount = rate x billed_quantity, rounded once."""

    kind: str  # "usage" (this month) or "adjustment" (a closed month's late data)
    # the closed month an adjustment charges late usage of; "" on a usage line
    adjusted_month: str
    cluster: str
    account: str
    user: str
    partition: str
    tres: str
    gpu_model: str
    allocated_tres_seconds: Decimal
    waived_tres_seconds: Decimal
    billed_quantity: Decimal
    waived_quantity: Decimal
    billed_unit: str
    priced: bool
    rate: Decimal | None
    amount: Decimal | None
    waived_amount: Decimal | None
    billable_amount: Decimal | None
    # why an adjustment exists (empty on usage lines)
    cause: str = ""
    # the account's ledger codes when the statement was made (config or sacctmgr)
    pi: str = ""
    cost_centre: str = ""
    gl_code: str = ""
    # energy lines: the kWh x the grid's carbon intensity (chargeback.carbon_grams_per_kwh)
    co2e_kilograms: Decimal | None = None

    @property
    def key(self) -> Key:
        return (self.cluster, self.account, self.user, self.partition, self.gpu_model, self.tres)


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
    # the month's edges as it was cut when it was closed (site.timezone then)
    month_start_at: datetime | None = None
    month_end_at: datetime | None = None
    # 1: closed before statement format 2 (its bytes have no number, date or checksum column)
    format_version: int = 2
    # sequential over every statement ever closed (voided ones keep theirs)
    statement_number: int | None = None

    def verified(self) -> ClosedStatement:
        """Self, after checking the stored bytes still match their checksums."""
        for name, data, digest in (("CSV", self.csv, self.csv_sha256), ("JSON", self.json, self.json_sha256)):
            if sha256(data) != digest:
                raise ChargebackError(
                    f"the stored {name} statement of {self.month} does not match its sha256 {digest}"
                )
        return self


def line_to_data(line: StatementLine) -> dict[str, Any]:
    """A line as JSON data (decimals as strings) for the statement table."""
    return {k: _json(v) for k, v in asdict(line).items()}


def _decimal(data: Mapping[str, Any], name: str) -> Decimal | None:
    value = data.get(name)
    return None if value is None or value == "" else Decimal(str(value))


def line_from_data(data: Mapping[str, Any]) -> StatementLine:
    """A stored line: format 2 as it is, format 1 (gpu_hours, for_month) converted."""
    if "gpu_hours" in data:
        return line_from_format_1(data)

    def req(name: str) -> Decimal:
        return _decimal(data, name) or ZERO

    return StatementLine(
        kind=str(data["kind"]),
        adjusted_month=str(data["adjusted_month"]),
        cluster=str(data["cluster"]),
        account=str(data["account"]),
        user=str(data["user"]),
        partition=str(data["partition"]),
        tres=str(data["tres"]),
        gpu_model=str(data["gpu_model"]),
        allocated_tres_seconds=req("allocated_tres_seconds"),
        waived_tres_seconds=req("waived_tres_seconds"),
        billed_quantity=req("billed_quantity"),
        waived_quantity=req("waived_quantity"),
        billed_unit=str(data["billed_unit"]),
        priced=bool(data["priced"]),
        rate=_decimal(data, "rate"),
        amount=_decimal(data, "amount"),
        waived_amount=_decimal(data, "waived_amount"),
        billable_amount=_decimal(data, "billable_amount"),
        cause=str(data.get("cause", "")),
        pi=str(data.get("pi", "")),
        cost_centre=str(data.get("cost_centre", "")),
        gl_code=str(data.get("gl_code", "")),
        co2e_kilograms=_decimal(data, "co2e_kilograms"),
    )


SECONDS_PER_HOUR = Decimal(3600)
FORMAT_1_BILLING_UNIT = "billing_hour"


def line_from_format_1(data: Mapping[str, Any]) -> StatementLine:
    """A format-1 line (its JSON data or CSV record) as a format-2 line, figures unchanged.

    Format 1 priced one basis per line: GPU-hours (rate_unit gpu_hour) or Slurm's billing
    TRES-hours (billing_hour), shown to 4 decimals; its TRES-seconds are those hours x 3600,
    exact. It kept no waived billing-hours: a billing line's waived_tres_seconds is 0 (its
    waived_amount is exact). Its money figures are taken as they are."""
    billing = str(data["rate_unit"]) == FORMAT_1_BILLING_UNIT
    basis = _decimal(data, "billing_hours" if billing else "gpu_hours") or ZERO
    waived = ZERO if billing else (_decimal(data, "waived_gpu_hours") or ZERO)
    kind = str(data["kind"])
    return StatementLine(
        kind=kind,
        adjusted_month=str(data["for_month"]) if kind == "adjustment" else "",
        cluster=str(data["cluster"]),
        account=str(data["account"]),
        user=str(data["user"]),
        partition=str(data["partition"]),
        tres="billing" if billing else "gres/gpu",
        gpu_model=str(data["gpu_model"]),
        allocated_tres_seconds=basis * SECONDS_PER_HOUR,
        waived_tres_seconds=waived * SECONDS_PER_HOUR,
        billed_quantity=basis,
        waived_quantity=waived,
        billed_unit=str(data["rate_unit"]),
        priced=data["priced"] in (True, "true"),
        rate=_decimal(data, "rate"),
        amount=_decimal(data, "amount"),
        waived_amount=_decimal(data, "waived_amount"),
        billable_amount=_decimal(data, "billable_amount"),
        # statements closed before adjustments named their cause have none
        cause=str(data.get("cause", "")),
    )
