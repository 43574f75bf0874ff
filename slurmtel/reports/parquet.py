"""Parquet export of report rows (optional: needs pyarrow, `pip install 'slurmtel[parquet]'`).

Exact types, never a binary float: a column whose values are Decimal is decimal128 with the
largest scale its values have (money keeps its cents, hours their 4 decimals), datetimes are
UTC timestamps, booleans booleans, everything else text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from slurmtel.errors import SlurmtelError


class ParquetUnavailable(SlurmtelError):
    kind = "environment_error"


def _arrow_type(pa: Any, values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None and v != ""]
    if present and all(isinstance(v, Decimal) for v in present):
        scale = max(max(0, -int(v.as_tuple().exponent)) for v in present)
        return pa.decimal128(38, scale)
    if present and all(isinstance(v, bool) for v in present):
        return pa.bool_()
    if present and all(isinstance(v, datetime) for v in present):
        return pa.timestamp("us", tz="UTC")
    return pa.string()


def write_parquet(
    records: Sequence[Mapping[str, Any]], columns: Sequence[str], path: Path | None, currency: str
) -> None:
    """RECORDS' COLUMNS into the Parquet file PATH (currency kept as file metadata)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ParquetUnavailable(
            "--format parquet needs pyarrow: pip install 'slurmtel[parquet]' (csv and json need nothing)"
        ) from None
    if path is None:
        raise ParquetUnavailable("--format parquet writes a file: give --output FILE")
    arrays, fields = [], []
    for column in columns:
        values = [record.get(column) for record in records]
        kind = _arrow_type(pa, values)
        if kind == pa.string():
            cleaned: list[Any] = [None if v is None else str(v) for v in values]
        else:
            cleaned = [None if v is None or v == "" else v for v in values]
        arrays.append(pa.array(cleaned, type=kind))
        fields.append(pa.field(column, kind))
    metadata = {b"slurmtel.currency": currency.encode()} if currency else None
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))
    pq.write_table(table, str(path))
