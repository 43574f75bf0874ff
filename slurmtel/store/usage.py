"""GPU usage by account, user or partition over a window (`slurmtel report usage`).

allocated GPU-seconds of an attempt = AllocTRES gres/gpu x the part of [start, end) inside the
window (running attempts up to `now`), so a window's figures add up exactly across adjacent
windows and agree with sreport on the same slurmdbd. The windowing, the scope and the filter are
the database functions slurmtel_windowed_attempts, slurmtel_in_scope and slurmtel_job_filter
(migrations/versions/0011_report_functions.py), which every report calls.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.access import Scope

# re-exported: they lived here before slurmtel.filters
from slurmtel.filters import OUTCOME_CLASSES, JobFilter

__all__ = ["GROUPS", "OUTCOME_CLASSES", "JobFilter", "usage_report"]

GROUPS = {"account": "account", "user": "user_name", "partition": "partition"}


def usage_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    by: str,
    scope: Scope,
    job_filter: JobFilter | None = None,
) -> list[dict[str, Any]]:
    """One row per (cluster, group) with GPU-seconds by outcome class, jobs and queue wait."""
    if by not in GROUPS:
        raise ValueError(f"--by must be one of {', '.join(GROUPS)}")
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    column = GROUPS[by]
    per_class = ",\n".join(
        f"coalesce(sum(gpu_seconds) FILTER (WHERE outcome = '{c}'), 0) AS gpu_seconds_{c}"
        for c in OUTCOME_CLASSES
    )
    sql = f"""
        WITH w AS (SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)),
        waits AS (
            SELECT cluster, {column} AS grp,
                   extract(epoch FROM start_at - eligible_at) AS wait_seconds
            FROM w
            WHERE start_at >= CAST(:start AS timestamptz) AND start_at < CAST(:end AS timestamptz)
              AND eligible_at IS NOT NULL AND start_at >= eligible_at
        ),
        wait_stats AS (
            SELECT cluster, grp, count(*) AS n,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_seconds) AS p50,
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_seconds) AS p95,
                   max(wait_seconds) AS mx
            FROM waits GROUP BY cluster, grp
        ),
        usage AS (
            SELECT cluster, {column} AS grp,
                   count(DISTINCT (job_id_raw, coalesce(job_submit_at, submit_at))) AS jobs,
                   count(*) AS attempts,
                   count(*) FILTER (WHERE attempt_number > 1) AS requeues,
                   coalesce(sum(gpu_seconds), 0) AS allocated_gpu_seconds,
                   {per_class}
            FROM w GROUP BY cluster, {column}
        )
        SELECT u.*, coalesce(s.n, 0) AS queue_wait_count, s.p50, s.p95, s.mx
        FROM usage u LEFT JOIN wait_stats s USING (cluster, grp)
        ORDER BY u.cluster, u.allocated_gpu_seconds DESC, u.grp
    """
    params: dict[str, Any] = {"start": start, "end": end, "now": now}
    params.update(scope.sql_params())
    params.update((job_filter or JobFilter()).sql_params())
    rows = []
    for r in conn.execute(text(sql), params).mappings():
        allocated = _seconds(r["allocated_gpu_seconds"])
        by_class = {f"gpu_seconds_{c}": _seconds(r[f"gpu_seconds_{c}"]) for c in OUTCOME_CLASSES}
        rows.append(
            {
                "cluster": r["cluster"],
                by: r["grp"],
                "jobs": int(r["jobs"]),
                "attempts": int(r["attempts"]),
                "requeues": int(r["requeues"]),
                "allocated_gpu_seconds": allocated,
                "allocated_gpu_hours": round(allocated / 3600, 4),
                **by_class,
                "failed_gpu_seconds": by_class["gpu_seconds_user_failure"]
                + by_class["gpu_seconds_system_failure"],
                "queue_wait_count": int(r["queue_wait_count"]),
                "queue_wait_p50_seconds": _maybe(r["p50"]),
                "queue_wait_p95_seconds": _maybe(r["p95"]),
                "queue_wait_max_seconds": _maybe(r["mx"]),
            }
        )
    return rows


def _seconds(value: Any) -> int | float:
    """Whole seconds stay ints (sacct times are whole seconds); fractions from odd windows stay."""
    number = float(value or 0)
    return int(number) if number.is_integer() else round(number, 3)


def _maybe(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)
