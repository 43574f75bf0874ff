"""Plain row types that cross the store's wall: the store returns them, the reports, budgets
and chargeback shape them.

They live here, not with the code that shapes them, because the store may import no report,
budget or chargeback module (tests/test_layers.py); and here they import nothing of slurmtel but
its errors. The modules that use them re-export them (`from slurmtel.chargeback import
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

ZERO = Decimal(0)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json(value: Any) -> Any:
    # money and hours stay exact: decimal strings, not binary floats
    return str(value) if isinstance(value, Decimal) else value


# --- a job's view (store/jobview.py -> reports/advice.py, reports/plot.py) -------------------


@dataclass(frozen=True)
class GpuFigures:
    """What one GPU did for one attempt (gpu_attribution summed over days).

    mapping 'unmapped' (gpu_uuid '') is the part of the allocation no GPU could be mapped to.
    """

    gpu_uuid: str
    node: str
    mapping: str
    allocated_seconds: float
    covered_seconds: float
    idle_seconds: float
    no_process_seconds: float
    unmeasured_seconds: float
    util_weighted_sum: float
    util_max_percent: float | None
    memory_used_max_bytes: int | None
    energy_joules: float | None
    memory_total_bytes: int | None = None
    gpu_fraction: float = 1.0
    model: str = ""
    # the GPU's index on its node (the job's allocation, else the node's inventory)
    gpu_index: int | None = None
    # the highest window mean power of the GPU during the attempt
    power_max_watts: float | None = None
    # the GPU's power cap (its inventory; None where no source gave it)
    power_limit_watts: float | None = None

    @property
    def mapped(self) -> bool:
        return self.mapping != "unmapped"

    @property
    def name(self) -> str:
        """`node/index` as nvidia-smi numbers it; the UUID where the index is unknown."""
        if not self.mapped:
            return f"{self.node}/(unmapped)"
        return f"{self.node}/{self.gpu_index}" if self.gpu_index is not None else self.gpu_uuid

    @property
    def power_mean_watts(self) -> float | None:
        """Energy over the measured seconds."""
        if self.energy_joules is None or self.covered_seconds <= 0:
            return None
        return self.energy_joules / self.covered_seconds

    @property
    def mean_util_percent(self) -> float | None:
        return self.util_weighted_sum / self.covered_seconds if self.covered_seconds > 0 else None

    @property
    def idle_share(self) -> float | None:
        """Idle seconds / measured (covered) seconds."""
        return self.idle_seconds / self.covered_seconds if self.covered_seconds > 0 else None

    @property
    def coverage(self) -> float | None:
        """Measured seconds / allocated seconds."""
        return self.covered_seconds / self.allocated_seconds if self.allocated_seconds > 0 else None


@dataclass(frozen=True)
class UtilWindow:
    """One telemetry window of one GPU (a gpu_summary row)."""

    gpu_uuid: str
    window_start_at: datetime
    window_seconds: float
    util_mean_percent: float | None
    source: str = "agent"
    memory_used_max_bytes: int | None = None
    power_mean_watts: float | None = None


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
    # why an adjustment exists (empty on usage lines)
    cause: str = ""

    @property
    def key(self) -> Key:
        return (self.cluster, self.account, self.user, self.partition, self.gpu_model)


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
        # statements closed before adjustments named their cause have none
        cause=str(data.get("cause", "")),
    )
