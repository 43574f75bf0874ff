"""Chargeback's model: its constants, its errors, the statement's columns and the types of a
statement. The row types the store returns (UsageFigure, StatementLine, ClosedStatement) live in
slurmtel.rows (the package docstring says why); the package re-exports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
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


# Statement format: 2 since statements hold only lines, name the TRES and the billed unit, and
# carry their number, date and checksum. 1: closed before (stored bytes re-export unchanged).
FORMAT_VERSION = 2


# seconds and billed quantities as a statement shows them (ROUND_HALF_EVEN)
SECONDS = Decimal("0.01")
QUANTITY = Decimal("0.000001")


TRES_GPU = "gres/gpu"
TRES_BILLING = "billing"
TRES_CPU = "cpu"
TRES_MEM = "mem"
TRES_NODE = "node"
TRES_ENERGY = "energy"


RATE_UNIT_GPU = "gpu_hour"
RATE_UNIT_BILLING = "billing_hour"
RATE_UNIT_CPU = "cpu_hour"
RATE_UNIT_MEM = "gib_hour"
RATE_UNIT_NODE = "node_hour"
RATE_UNIT_ENERGY = "kwh"


# the unit a TRES is billed in, and how many TRES-seconds make one (Slurm counts mem in MB)
BILLED_UNITS = {
    TRES_GPU: (RATE_UNIT_GPU, SECONDS_PER_HOUR),
    TRES_BILLING: (RATE_UNIT_BILLING, SECONDS_PER_HOUR),
    TRES_CPU: (RATE_UNIT_CPU, SECONDS_PER_HOUR),
    TRES_MEM: (RATE_UNIT_MEM, SECONDS_PER_HOUR * 1024),
    TRES_NODE: (RATE_UNIT_NODE, SECONDS_PER_HOUR),
    # energy is consumed, not allocated: its figure is joules (3.6 MJ = 1 kWh), not TRES-seconds
    TRES_ENERGY: (RATE_UNIT_ENERGY, Decimal(3_600_000)),
}


# kg CO2e to the gram
KILOGRAMS = Decimal("0.001")


# What identifies a statement, on every row of its CSVs (docs/chargeback.md documents each)
STATEMENT_HEADER_COLUMNS = (
    "format_version",
    "statement_number",
    "statement_date",
    "statement_status",
    "statement_sha256",
    "month",
    "currency",
)


# The statement's lines: one row per line, nothing else, so a spreadsheet's SUM of a money
# column is the statement's total.
LINE_COLUMNS = (
    *STATEMENT_HEADER_COLUMNS,
    "kind",
    "adjusted_month",
    "cluster",
    "account",
    "cost_centre",
    "gl_code",
    "pi",
    "user",
    "partition",
    "tres",
    "gpu_model",
    "allocated_tres_seconds",
    "waived_tres_seconds",
    "billed_quantity",
    "waived_quantity",
    "billed_unit",
    "priced",
    "rate",
    "amount",
    "waived_amount",
    "billable_amount",
    "co2e_kilograms",
    "cause",
)


# `--totals`: one row per billed unit (quantities of different units are never added)
TOTALS_COLUMNS = (
    *STATEMENT_HEADER_COLUMNS,
    "billed_unit",
    "line_count",
    "unpriced_line_count",
    "allocated_tres_seconds",
    "billed_quantity",
    "waived_quantity",
    "unpriced_quantity",
    "amount",
    "waived_amount",
    "billable_amount",
    "co2e_kilograms",
)


# `--by account|parent|top`: one subtotal row per rolled-up account and billed unit
ROLLUP_COLUMNS = (
    *STATEMENT_HEADER_COLUMNS,
    "rollup_level",
    "rollup_account",
    *TOTALS_COLUMNS[len(STATEMENT_HEADER_COLUMNS) :],
)


# account, parent, top: up the Slurm account tree; pi, cost_centre, gl_code: by the lines' codes
ROLLUP_LEVELS = ("account", "parent", "top", "pi", "cost_centre", "gl_code")
TREE_LEVELS = ("parent", "top")


COMPLETED_COLUMNS = (
    "month",
    "account",
    "completed_jobs",
    "allocated_gpu_seconds",
    "amount",
    "billable_amount",
    "unpriced_line_count",
    "cost_per_completed_job",
    "billable_per_completed_job",
    "currency",
)


class MonthAlreadyClosed(ChargebackError):
    pass


class CloseRefused(ChargebackError):
    """A close that --force would do: the month has no usage, or a later month is closed."""


@dataclass(frozen=True)
class UnitTotals:
    """The lines of one billed unit, summed (each figure a sum of rounded lines)."""

    billed_unit: str
    line_count: int
    unpriced_line_count: int
    allocated_tres_seconds: Decimal
    billed_quantity: Decimal
    waived_quantity: Decimal
    unpriced_quantity: Decimal
    amount: Decimal
    waived_amount: Decimal
    billable_amount: Decimal
    # of energy lines (kwh) with chargeback.carbon_grams_per_kwh; None otherwise
    co2e_kilograms: Decimal | None = None


@dataclass(frozen=True)
class Totals:
    amount: Decimal
    waived_amount: Decimal
    billable_amount: Decimal
    line_count: int
    unpriced_line_count: int
    by_unit: tuple[UnitTotals, ...]

    @property
    def priced(self) -> bool:
        return self.unpriced_line_count == 0

    def unit(self, billed_unit: str) -> UnitTotals | None:
        return next((u for u in self.by_unit if u.billed_unit == billed_unit), None)


@dataclass(frozen=True)
class CompletedJobCost:
    """Cost per completed job of one account (this month's usage, adjustments left out)."""

    account: str
    completed_jobs: int
    allocated_gpu_seconds: Decimal
    amount: Decimal | None
    billable_amount: Decimal | None
    unpriced_line_count: int
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
    # set when closed: the statement's number and date (the close date in site.timezone)
    statement_number: int | None = None
    statement_date: date | None = None
    month_start_at: datetime | None = None
    month_end_at: datetime | None = None
    format_version: int = FORMAT_VERSION
    # a PI's statement (`--pi`): the site's statement restricted to the lines of that PI
    pi: str | None = None


DIFF_COLUMNS = (
    "month",
    "cluster",
    "account",
    "user",
    "partition",
    "tres",
    "gpu_model",
    "closed_allocated_tres_seconds",
    "now_allocated_tres_seconds",
    "billed_unit",
    "closed_rate",
    "now_rate",
    "closed_billable_amount",
    "now_billable_amount",
    "billable_amount_change",
    "currency",
)
