"""Chargeback: monthly statements per account x user x partition x GPU model (DESIGN §4, §7).

A package of small modules, each importing only those before it:
- model.py: constants, errors, the statement's columns and types;
- pricing.py: pure money logic (no I/O, no clock): rate matching, pricing, rounding,
  adjustments, totals, frozen pricing, which month is due;
- ledger.py: each account's PI, cost centre and GL code (config, sacctmgr, the account tree);
- legacy.py: statement format 1's pricing, for months closed before format 2;
- render.py: the exact bytes of a statement (lines CSV, totals, roll-ups, JSON), a stored one
  read back, and the check of a statement file's own checksum;
- closing.py: build, close, void and diff against the database through slurmtel.store.chargeback.
Month arithmetic (month_first_day, next_month, previous_month, month_of) is in slurmtel.timeparse,
the advisory lock of closing a month in slurmtel.store.locks. Every public name is re-exported
here: `from slurmtel.chargeback import X` works for each.

Where the row types live: the store may not import chargeback (tests/test_layers.py: no import
cycle, no store -> chargeback import), yet it reads and writes usage figures and closed
statements. So the types that cross that wall (UsageFigure, StatementLine, ClosedStatement, and
line_to_data/line_from_data, the statement table's JSON of a line) live in slurmtel.rows, a
neutral module both import, and ChargebackError in slurmtel.errors; the store returns them, this
package prices and renders them. Types only chargeback uses (Statement, Totals,
CompletedJobCost) stay in model.py.

Money rules:
- Money is `Decimal` end to end: usage seconds come from SQL `numeric`, prices from strings in
  the config (TOML floats are binary), never a float.
- A line bills one TRES (gres/gpu, cpu, mem, node or Slurm's billing) of one key. Its
  allocated_tres_seconds (Slurm's TRES count x seconds, exact from SQL numeric, shown to the
  hundredth) in the TRES's billed unit is billed_quantity (GPU-, CPU-, node-, billing-hours;
  GiB-hours for mem, Slurm counting MB), to 6 decimals; amount = rate x billed_quantity,
  rounded ONCE to the currency's minor unit (cents) with ROUND_HALF_EVEN (banker's rounding:
  halves go to the even cent, so rounding errors do not drift one way), so a ledger that
  multiplies the two printed figures gets the amount; waived_amount likewise;
  billable_amount = amount - waived_amount (of the rounded figures, so every line adds up).
- Totals are the sums of the rounded lines, per billed unit, in their own file: the lines CSV
  holds lines only, so a spreadsheet summing its amount column gets the total.
- Statement format 2 (FORMAT_VERSION); a month closed in format 1 keeps its bytes, and its
  late data is priced as format 1 priced it (legacy.py) before it becomes a format-2
  adjustment line.
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

from slurmtel.chargeback.closing import (
    build_statement,
    close_due_month,
    close_guards,
    close_month,
    closed_statement,
    closed_usage_now,
    diff_closed_month,
    diff_records,
    usage_lines,
    void_month,
)
from slurmtel.chargeback.ledger import NO_LEDGER, Ledger, LedgerCodes, ledger_of, load_ledger, with_codes
from slurmtel.chargeback.legacy import price_usage_format_1
from slurmtel.chargeback.model import (
    BILLED_UNITS,
    COMPLETED_COLUMNS,
    DIFF_COLUMNS,
    FORMAT_VERSION,
    HOURS,
    LINE_COLUMNS,
    MINOR_UNITS,
    QUANTITY,
    RATE_UNIT_BILLING,
    RATE_UNIT_CPU,
    RATE_UNIT_ENERGY,
    RATE_UNIT_GPU,
    RATE_UNIT_MEM,
    RATE_UNIT_NODE,
    ROLLUP_COLUMNS,
    ROLLUP_LEVELS,
    ROUNDING,
    SECONDS,
    SECONDS_PER_HOUR,
    STATEMENT_HEADER_COLUMNS,
    TOTALS_COLUMNS,
    TREE_LEVELS,
    TRES_BILLING,
    TRES_CPU,
    TRES_ENERGY,
    TRES_GPU,
    TRES_MEM,
    TRES_NODE,
    ZERO,
    CloseRefused,
    CompletedJobCost,
    MonthAlreadyClosed,
    Statement,
    Totals,
    UnitTotals,
)
from slurmtel.chargeback.pricing import (
    adjustment_cause,
    adjustment_lines,
    amount_of,
    assemble,
    billed_unit,
    charge,
    check_month,
    co2e_of,
    completed_job_costs,
    frozen_pricing,
    hours,
    match_rate,
    money_quantum,
    month_due_for_closing,
    months_adjusted_in,
    price_usage,
    priced_tres,
    quantity,
    rate_notices,
    settings_format,
    settings_of,
    totals,
)
from slurmtel.chargeback.render import (
    completed_record,
    for_pi,
    line_records,
    records_csv,
    render_completed_csv,
    render_csv,
    render_json,
    render_totals_csv,
    rollup_account,
    rollup_key,
    rollup_records,
    statement_header,
    statement_of_closed,
    statement_sha256,
    totals_records,
    verify_statement_file,
)
from slurmtel.errors import ChargebackError
from slurmtel.rows import (
    ClosedStatement,
    Key,
    LegacyUsageFigure,
    StatementLine,
    UsageFigure,
    line_from_data,
    line_from_format_1,
    line_to_data,
    sha256,
)
from slurmtel.timeparse import month_first_day, month_of, next_month, previous_month

__all__ = [
    "BILLED_UNITS",
    "COMPLETED_COLUMNS",
    "DIFF_COLUMNS",
    "FORMAT_VERSION",
    "HOURS",
    "LINE_COLUMNS",
    "MINOR_UNITS",
    "NO_LEDGER",
    "QUANTITY",
    "RATE_UNIT_BILLING",
    "RATE_UNIT_CPU",
    "RATE_UNIT_ENERGY",
    "RATE_UNIT_GPU",
    "RATE_UNIT_MEM",
    "RATE_UNIT_NODE",
    "ROLLUP_COLUMNS",
    "ROLLUP_LEVELS",
    "ROUNDING",
    "SECONDS",
    "SECONDS_PER_HOUR",
    "STATEMENT_HEADER_COLUMNS",
    "TOTALS_COLUMNS",
    "TREE_LEVELS",
    "TRES_BILLING",
    "TRES_CPU",
    "TRES_ENERGY",
    "TRES_GPU",
    "TRES_MEM",
    "TRES_NODE",
    "ZERO",
    "ChargebackError",
    "CloseRefused",
    "ClosedStatement",
    "CompletedJobCost",
    "Key",
    "Ledger",
    "LedgerCodes",
    "LegacyUsageFigure",
    "MonthAlreadyClosed",
    "Statement",
    "StatementLine",
    "Totals",
    "UnitTotals",
    "UsageFigure",
    "adjustment_cause",
    "adjustment_lines",
    "amount_of",
    "assemble",
    "billed_unit",
    "build_statement",
    "charge",
    "check_month",
    "close_due_month",
    "close_guards",
    "close_month",
    "closed_statement",
    "closed_usage_now",
    "co2e_of",
    "completed_job_costs",
    "completed_record",
    "diff_closed_month",
    "diff_records",
    "for_pi",
    "frozen_pricing",
    "hours",
    "ledger_of",
    "line_from_data",
    "line_from_format_1",
    "line_records",
    "line_to_data",
    "load_ledger",
    "match_rate",
    "money_quantum",
    "month_due_for_closing",
    "month_first_day",
    "month_of",
    "months_adjusted_in",
    "next_month",
    "previous_month",
    "price_usage",
    "price_usage_format_1",
    "priced_tres",
    "quantity",
    "rate_notices",
    "records_csv",
    "render_completed_csv",
    "render_csv",
    "render_json",
    "render_totals_csv",
    "rollup_account",
    "rollup_key",
    "rollup_records",
    "settings_format",
    "settings_of",
    "sha256",
    "statement_header",
    "statement_of_closed",
    "statement_sha256",
    "totals",
    "totals_records",
    "usage_lines",
    "verify_statement_file",
    "void_month",
    "with_codes",
]
