"""Statement format 1, kept for the months closed in it (pure).

A month closed before format 2 is frozen as format 1 bytes and lines: GPU-hours or billing-hours
shown to 4 decimals, amounts from the exact seconds. Its late data is still charged as
adjustments, computed as current - frozen - already adjusted. For those differences to be zero
when nothing changed, the current usage of such a month is priced exactly as format 1 priced it
(this module, format 1's price_usage unchanged) and converted to format-2 lines the same way its
frozen lines are (slurmtel.rows.line_from_format_1).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from slurmtel.chargeback.model import RATE_UNIT_BILLING, RATE_UNIT_GPU, TRES_GPU, ZERO
from slurmtel.chargeback.pricing import charge, hours, match_rate
from slurmtel.config import ChargebackConfig
from slurmtel.rows import LegacyUsageFigure, StatementLine, line_from_format_1
from slurmtel.timeparse import month_first_day

FORMAT_1 = 1


def price_usage_format_1(
    figures: Iterable[LegacyUsageFigure], month: str, config: ChargebackConfig
) -> list[StatementLine]:
    """MONTH's usage priced as statement format 1 priced it, as format-2 lines."""
    first_day = month_first_day(month)
    currency = config.currency
    lines = []
    for f in sorted(figures, key=lambda f: (f.cluster, f.account, f.user, f.partition, f.gpu_model)):
        waived_gpu = f.system_failure_gpu_seconds if config.waive_system_failures else ZERO
        waived_billing = f.system_failure_billing_seconds if config.waive_system_failures else ZERO
        rate: Decimal | None
        if config.use_billing_tres:
            rate = Decimal(config.billing_rate) if f.billing_seconds > 0 or f.gpu_seconds == 0 else None
            unit, basis, waived_basis = RATE_UNIT_BILLING, f.billing_seconds, waived_billing
        else:
            matched = match_rate(config.rates, f.partition, f.gpu_model, first_day, TRES_GPU)
            rate = matched.price_of(TRES_GPU) if matched is not None else None
            unit, basis, waived_basis = RATE_UNIT_GPU, f.gpu_seconds, waived_gpu
        amount = waived_amount = billable = None
        if rate is not None:
            amount = charge(rate, basis, currency)
            waived_amount = charge(rate, waived_basis, currency)
            billable = amount - waived_amount
        data: dict[str, Any] = {
            "kind": "usage",
            "for_month": month,
            "cluster": f.cluster,
            "account": f.account,
            "user": f.user,
            "partition": f.partition,
            "gpu_model": f.gpu_model,
            "gpu_hours": hours(f.gpu_seconds),
            "billing_hours": hours(f.billing_seconds),
            "priced": rate is not None,
            "rate": rate,
            "rate_unit": unit,
            "amount": amount,
            "waived_gpu_hours": hours(waived_gpu),
            "waived_amount": waived_amount,
            "billable_amount": billable,
        }
        lines.append(line_from_format_1(data))
    return lines
