"""Budget SQL: usage so far per month (chargeback's own query) and the attempts running at AT.

Used figures come from slurmtel.store.chargeback.usage_figures, unchanged, so a budget's used
GPU-hours equal the chargeback statement's for the same months. Every query takes the scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.access import Scope
from slurmtel.rows import MonthSlice, RunningAttempt, UsageFigure
from slurmtel.store.chargeback import usage_figures


def usage_by_month(
    conn: Connection, slices: list[MonthSlice], *, now: datetime, scope: Scope, tres: Sequence[str]
) -> dict[str, list[UsageFigure]]:
    """YYYY-MM -> chargeback's usage figures of TRES in that month's slice (up to NOW)."""
    return {
        s.month: usage_figures(conn, start=s.start_at, end=s.end_at, now=now, scope=scope, tres=tres)
        for s in slices
    }


def running_attempts(conn: Connection, *, at: datetime, scope: Scope, billing: bool) -> list[RunningAttempt]:
    """Attempts running at AT (started, not ended by then) with GPUs (any with BILLING)."""
    sql = """
        SELECT account, partition, slurmtel_gpu_model(alloc_gpus, gpu_model) AS model, alloc_gpus,
               coalesce(CAST(alloc_tres ->> 'billing' AS numeric), 0) AS billing,
               start_at, time_limit_seconds
        FROM job_attempt
        WHERE start_at IS NOT NULL AND start_at <= CAST(:at AS timestamptz)
          AND (end_at IS NULL OR end_at > CAST(:at AS timestamptz))
          AND (alloc_gpus > 0 OR CAST(:billing AS boolean))
          AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
        ORDER BY account, start_at
    """
    params: dict[str, Any] = {"at": at, "billing": billing}
    params.update(scope.sql_params())
    return [
        RunningAttempt(
            account=r.account,
            partition=r.partition,
            gpu_model=r.model,
            alloc_gpus=int(r.alloc_gpus),
            billing=Decimal(r.billing),
            start_at=r.start_at,
            time_limit_seconds=r.time_limit_seconds,
        )
        for r in conn.execute(text(sql), params)
    ]
