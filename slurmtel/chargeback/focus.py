"""A statement as FOCUS 1.2 rows (issue 27 item 4): the FinOps Foundation's open cost and usage
format, what OpenCost, Kubecost and the clouds' billing exports speak. Pure: records, CSV, and
the Parquet file's schema.

One FOCUS row per statement line:
- Usage lines are ChargeCategory `Usage`; adjustment lines (late usage of a closed month) are
  `Adjustment` with ChargeClass `Correction` and the adjusted month as their charge period;
  the billing period is the statement's month.
- ListCost = ContractedCost = the line's amount (rate x billed quantity); BilledCost =
  EffectiveCost = its billable amount (waived failures taken off); ListUnitPrice =
  ContractedUnitPrice = its rate; ConsumedQuantity = PricingQuantity = its billed quantity in
  ConsumedUnit = PricingUnit (GPU-Hours, CPU-Hours, GiB-Hours, Node-Hours, Billing-Hours, kWh).
  An unpriced line has costs 0 and no unit price: FOCUS costs are never null, so x_Priced
  says it was not priced (and the CLI warns, as for the statement).
- ResourceId is the Slurm account (cluster/account), SubAccountId the account; Tags hold the
  user, partition, cluster, TRES, GPU model and the ledger codes.
- Custom columns (FOCUS: prefixed x_) say whether the month is closed, its statement number
  and checksum, and whether the line was priced.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from slurmtel.chargeback.model import Statement
from slurmtel.chargeback.pricing import money_quantum
from slurmtel.chargeback.render import statement_sha256
from slurmtel.rows import StatementLine
from slurmtel.timeparse import month_bounds

FOCUS_VERSION = "1.2"

# column -> FOCUS data type (the spec's columns/*.md "Data type"); in the order written
FOCUS_COLUMNS: dict[str, str] = {
    "BilledCost": "Decimal",
    "BillingAccountId": "String",
    "BillingAccountName": "String",
    "BillingAccountType": "String",
    "BillingCurrency": "String",
    "BillingPeriodEnd": "Date/Time",
    "BillingPeriodStart": "Date/Time",
    "ChargeCategory": "String",
    "ChargeClass": "String",
    "ChargeDescription": "String",
    "ChargeFrequency": "String",
    "ChargePeriodEnd": "Date/Time",
    "ChargePeriodStart": "Date/Time",
    "ConsumedQuantity": "Decimal",
    "ConsumedUnit": "String",
    "ContractedCost": "Decimal",
    "ContractedUnitPrice": "Decimal",
    "EffectiveCost": "Decimal",
    "InvoiceId": "String",
    "InvoiceIssuerName": "String",
    "ListCost": "Decimal",
    "ListUnitPrice": "Decimal",
    "PricingCategory": "String",
    "PricingQuantity": "Decimal",
    "PricingUnit": "String",
    "ProviderName": "String",
    "PublisherName": "String",
    "ResourceId": "String",
    "ResourceName": "String",
    "ResourceType": "String",
    "ServiceCategory": "String",
    "ServiceName": "String",
    "ServiceSubcategory": "String",
    "SubAccountId": "String",
    "SubAccountName": "String",
    "SubAccountType": "String",
    "Tags": "JSON",
    # custom columns (FOCUS: x_ prefix)
    "x_StatementStatus": "String",
    "x_StatementNumber": "String",
    "x_StatementSha256": "String",
    "x_Priced": "Boolean",
}

UNITS = {
    "gpu_hour": "GPU-Hours",
    "cpu_hour": "CPU-Hours",
    "gib_hour": "GiB-Hours",
    "node_hour": "Node-Hours",
    "billing_hour": "Billing-Hours",
    "kwh": "kWh",
}
WHAT = {
    "gres/gpu": "GPU-hours",
    "cpu": "CPU-hours",
    "mem": "memory GiB-hours",
    "node": "node-hours",
    "billing": "billing-hours",
    "energy": "energy",
}


def _instant(at: datetime | None) -> datetime | None:
    return at.astimezone(UTC) if at is not None else None


def _charge_period(statement: Statement, line: StatementLine) -> tuple[datetime | None, datetime | None]:
    """The period a line's usage happened in: the statement's month, or for an adjustment the
    closed month it corrects, cut in the zone the statement was made in."""
    if line.kind != "adjustment" or not line.adjusted_month:
        return statement.month_start_at, statement.month_end_at
    zone = ZoneInfo(str(statement.settings.get("timezone") or "UTC"))
    return month_bounds(line.adjusted_month, zone)


def focus_records(statement: Statement, provider: str = "") -> list[dict[str, Any]]:
    """STATEMENT's lines as FOCUS rows (column -> value; Decimal, datetime, dict for Tags)."""
    checksum = statement_sha256(statement)
    zero = Decimal(0).quantize(money_quantum(statement.currency))
    number = str(statement.statement_number) if statement.statement_number is not None else None
    records = []
    for line in statement.lines:
        issuer = provider or f"Slurm cluster {line.cluster}"
        charge_start, charge_end = _charge_period(statement, line)
        unit = UNITS.get(line.billed_unit, line.billed_unit)
        what = WHAT.get(line.tres, f"{line.tres}-hours")
        description = f"{what} of {line.user} in account {line.account}, partition {line.partition}"
        if line.tres == "gres/gpu" and line.gpu_model not in ("", "none", "unknown"):
            description += f", {line.gpu_model}"
        if line.kind == "adjustment":
            description = f"late usage of {line.adjusted_month}: {description}"
        tags = {
            "cluster": line.cluster,
            "user": line.user,
            "partition": line.partition,
            "tres": line.tres,
            "gpu_model": line.gpu_model,
            "pi": line.pi,
            "cost_centre": line.cost_centre,
            "gl_code": line.gl_code,
        }
        if line.co2e_kilograms is not None:
            tags["co2e_kilograms"] = str(line.co2e_kilograms)
        records.append(
            {
                "BilledCost": line.billable_amount if line.priced else zero,
                "BillingAccountId": line.cluster,
                "BillingAccountName": line.cluster,
                "BillingAccountType": "Slurm cluster",
                "BillingCurrency": statement.currency,
                "BillingPeriodEnd": _instant(statement.month_end_at),
                "BillingPeriodStart": _instant(statement.month_start_at),
                "ChargeCategory": "Adjustment" if line.kind == "adjustment" else "Usage",
                "ChargeClass": "Correction" if line.kind == "adjustment" else None,
                "ChargeDescription": description,
                "ChargeFrequency": "Usage-Based",
                "ChargePeriodEnd": _instant(charge_end),
                "ChargePeriodStart": _instant(charge_start),
                "ConsumedQuantity": line.billed_quantity,
                "ConsumedUnit": unit,
                "ContractedCost": line.amount if line.priced else zero,
                "ContractedUnitPrice": line.rate,
                "EffectiveCost": line.billable_amount if line.priced else zero,
                "InvoiceId": number,
                "InvoiceIssuerName": issuer,
                "ListCost": line.amount if line.priced else zero,
                "ListUnitPrice": line.rate,
                "PricingCategory": "Standard" if line.priced else None,
                "PricingQuantity": line.billed_quantity,
                "PricingUnit": unit,
                "ProviderName": issuer,
                "PublisherName": issuer,
                "ResourceId": f"{line.cluster}/{line.account}",
                "ResourceName": line.account,
                "ResourceType": "Slurm account",
                "ServiceCategory": "Compute",
                "ServiceName": f"Slurm cluster {line.cluster}",
                "ServiceSubcategory": "Other (Compute)",
                "SubAccountId": line.account,
                "SubAccountName": line.account,
                "SubAccountType": "Slurm account",
                "Tags": tags,
                "x_StatementStatus": statement.status,
                "x_StatementNumber": number,
                "x_StatementSha256": checksum,
                "x_Priced": line.priced,
            }
        )
    return records


def _text(column: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        # FOCUS Date/Time Format: ISO 8601 in UTC with a Z
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def render_focus_csv(records: Sequence[Mapping[str, Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FOCUS_COLUMNS)
    for record in records:
        writer.writerow([_text(c, record[c]) for c in FOCUS_COLUMNS])
    return out.getvalue().encode("utf-8")


def write_focus_parquet(records: Sequence[Mapping[str, Any]], path: Path, currency: str) -> None:
    """RECORDS into the Parquet file PATH with FOCUS types: Decimal as decimal128 (costs with
    the currency's decimals, quantities and prices with theirs), Date/Time as UTC timestamps,
    JSON (Tags) and String as text, x_Priced boolean."""
    from slurmtel.reports.parquet import ParquetUnavailable

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ParquetUnavailable(
            "--format focus-parquet needs pyarrow: pip install 'slurmtel[parquet]' (focus as CSV needs nothing)"
        ) from None
    money_places = -int(money_quantum(currency).as_tuple().exponent)
    arrays, fields = [], []
    for column, kind in FOCUS_COLUMNS.items():
        values = [record[column] for record in records]
        arrow_type: Any
        if kind == "Decimal":
            present = [v for v in values if v is not None]
            places = max([money_places, *(max(0, -int(v.as_tuple().exponent)) for v in present)])
            arrow_type = pa.decimal128(38, int(places))
        elif kind == "Date/Time":
            arrow_type = pa.timestamp("us", tz="UTC")
        elif kind == "Boolean":
            arrow_type = pa.bool_()
        else:
            arrow_type = pa.string()
            values = [None if v is None else _text(column, v) for v in values]
        arrays.append(pa.array(values, type=arrow_type))
        fields.append(pa.field(column, arrow_type))
    metadata = {b"focus.version": FOCUS_VERSION.encode(), b"slurmtel.currency": currency.encode()}
    pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata)), str(path))
