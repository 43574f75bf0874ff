"""What the admin reports share: outcome groups, units, the days a window touches, params.

The admin reports live in slurmtel/store/reports_*.py (failures, idle, queue, taxonomy and
capacity, nodes, retries). GPU-hours that come from attempts (failures, retries, queue) are
allocated GPU-seconds split exactly at the window's edges, as in `report usage`; GPU-hours that
come from the attribution rollup (idle, taxonomy, capacity) are whole site days, because the
rollup is kept per site day, and are physical: a MIG slice counts as its fraction of the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.sql import Connection, text

# a 30-day month, for useful work per GPU and month (DESIGN §1)


def no_jit(conn: Connection) -> None:
    """Settings for one report query, for this transaction only: no JIT (report queries are
    planned as expensive and JIT-compiled for seconds on every run, far more than it saves),
    room to sort and hash a month of rollups in memory rather than on disk, and no parallel
    workers (on a busy head node they compete with its load, a plan that is not parallel-aware
    builds the same hash table in every worker, and partial aggregates add float8 in an order
    that changes from run to run)."""
    conn.execute(text("SET LOCAL jit = off"))
    conn.execute(text("SET LOCAL work_mem = '32MB'"))
    conn.execute(text("SET LOCAL max_parallel_workers_per_gather = 0"))


def window_days(start: datetime, end: datetime, zone: ZoneInfo) -> tuple[date, date]:
    """The first and last site day that [start, end) touches."""
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    first = start.astimezone(zone).date()
    last = (end - timedelta(microseconds=1)).astimezone(zone).date()
    return first, last


def params(scope: Scope, job_filter: JobFilter | None = None, **values: Any) -> dict[str, Any]:
    """Bind parameters: the scope clause's, the filter clause's and VALUES."""
    result: dict[str, Any] = dict(values)
    result.update(scope.sql_params())
    result.update((job_filter or JobFilter()).sql_params())
    return result


def as_seconds(value: Any) -> int | float:
    """(GPU-)seconds as a report gives them: whole seconds as an int (sacct's times are whole
    seconds), a fraction (float8 sums of the rollups, MIG fractions) rounded to milliseconds."""
    number = float(value or 0)
    return int(number) if number.is_integer() else round(number, 3)


def share(part: Any, whole: Any, places: int = 4) -> float | None:
    """part / whole rounded, None when the whole is zero (no share to speak of)."""
    if not whole:
        return None
    return round(float(part or 0) / float(whole), places)


def seconds_value(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def apportion_seconds(parts: Sequence[Decimal], places: int = 3) -> tuple[Decimal, list[Decimal]]:
    """GPU-seconds PARTS rounded to PLACES (milliseconds) so that the rounded parts add up to the
    rounded total exactly (largest remainder; the total rounds half-even)."""
    unit = Decimal(1).scaleb(-places)
    exact = [Decimal(p) for p in parts]
    total = sum(exact, Decimal(0)).quantize(unit)
    floors = [(e / unit).to_integral_value(rounding="ROUND_FLOOR") for e in exact]
    missing = int(total / unit - sum(floors, Decimal(0)))
    order = sorted(range(len(exact)), key=lambda i: (exact[i] / unit - floors[i], -i), reverse=True)
    units = list(floors)
    # Σ floor(x) <= floor(Σ x) <= total and Σ (x - floor(x)) < n, so 0 <= missing <= n
    for i in order[:missing]:
        units[i] += 1
    return total, [(u * unit).quantize(unit) for u in units]
