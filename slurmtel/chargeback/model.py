"""Chargeback's model: its constants, its errors, the statement's columns and the types of a
statement. The row types the store returns (UsageFigure, StatementLine, ClosedStatement) live in
slurmtel.rows (the package docstring says why); the package re-exports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from slurmtel.errors import ChargebackError
from slurmtel.rows import (
    StatementLine,
)

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
