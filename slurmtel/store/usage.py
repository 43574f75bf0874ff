"""GPU usage by account, user or partition over a window (`slurmtel report usage`).

allocated GPU-seconds of an attempt = AllocTRES gres/gpu x the part of [start, end) inside the
window (running attempts up to `now`), so a window's figures add up exactly across adjacent
windows and agree with sreport on the same slurmdbd. The windowing, the scope and the filter are
the database functions slurmtel_windowed_attempts, slurmtel_in_scope and slurmtel_job_filter
(migrations/versions/0011_report_functions.py), which every report calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, tzinfo
from typing import Any

from slurmtel.access import Scope

# re-exported: they lived here before slurmtel.filters
from slurmtel.filters import OUTCOME_CLASSES, JobFilter
from slurmtel.store.reports_admin import as_seconds, no_jit, seconds_value
from slurmtel.store.sql import Connection, text
from slurmtel.timeparse import month_bounds, month_of, next_month

__all__ = ["GROUPS", "OUTCOME_CLASSES", "TRES_GROUPS", "JobFilter", "tres_usage_report", "usage_report"]

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
    # one pass over the windowed attempts, narrow columns only: the waits are the attempts
    # that started in the window (FILTER), so no second scan and no materialised wide CTE
    waited = (
        "start_at >= CAST(:start AS timestamptz) AND start_at < CAST(:end AS timestamptz) "
        "AND eligible_at IS NOT NULL AND start_at >= eligible_at"
    )
    sql = f"""
        SELECT cluster, grp,
               count(DISTINCT job_key) AS jobs,
               count(*) AS attempts,
               count(*) FILTER (WHERE attempt_number > 1) AS requeues,
               coalesce(sum(gpu_seconds), 0) AS allocated_gpu_seconds,
               {per_class},
               count(*) FILTER (WHERE waited) AS queue_wait_count,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_seconds) FILTER (WHERE waited) AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_seconds) FILTER (WHERE waited) AS p95,
               max(wait_seconds) FILTER (WHERE waited) AS mx
        FROM (
            -- a job is (job_id_raw, its first submit time): one numeric per job, compared far
            -- faster than a row; injective, as epochs of timestamptz lie within ±1e13 s
            SELECT cluster, {column} AS grp,
                   job_id_raw * CAST(1e14 AS numeric)
                       + extract(epoch FROM coalesce(job_submit_at, submit_at)) AS job_key,
                   attempt_number, outcome, gpu_seconds, {waited} AS waited,
                   extract(epoch FROM start_at - eligible_at) AS wait_seconds
            FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)
            -- OFFSET 0: each attempt's GPU-seconds computed once, not once per sum below
            OFFSET 0
        ) w
        GROUP BY cluster, grp
        ORDER BY cluster, allocated_gpu_seconds DESC, grp
    """
    params: dict[str, Any] = {"start": start, "end": end, "now": now}
    params.update(scope.sql_params())
    params.update((job_filter or JobFilter()).sql_params())
    rows = []
    no_jit(conn)
    for r in conn.execute(text(sql), params).mappings():
        allocated = as_seconds(r["allocated_gpu_seconds"])
        by_class = {f"{c}_gpu_seconds": as_seconds(r[f"gpu_seconds_{c}"]) for c in OUTCOME_CLASSES}
        rows.append(
            {
                "cluster": r["cluster"],
                by: r["grp"],
                "jobs": int(r["jobs"]),
                "attempts": int(r["attempts"]),
                "requeues": int(r["requeues"]),
                "allocated_gpu_seconds": allocated,
                **by_class,
                "failed_gpu_seconds": by_class["user_failure_gpu_seconds"]
                + by_class["system_failure_gpu_seconds"],
                "queue_wait_count": int(r["queue_wait_count"]),
                "queue_wait_p50_seconds": seconds_value(r["p50"]),
                "queue_wait_p95_seconds": seconds_value(r["p95"]),
                "queue_wait_max_seconds": seconds_value(r["mx"]),
            }
        )
    return rows


# Slurm's AllocTRES energy is the joules a job consumed, not a count held for its run time:
# it has no TRES-seconds (sreport adds a job's whole energy to every hour the job overlaps)
NOT_ALLOCATED_TRES = frozenset({"energy"})
TRES_GROUPS = {**GROUPS, "cluster": "cluster"}


def tres_usage_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    by: str,
    scope: Scope,
    zone: tzinfo,
    tres: Sequence[str] = (),
    job_filter: JobFilter | None = None,
) -> list[dict[str, Any]]:
    """Allocated TRES-seconds of every TRES Slurm accounts in AllocTRES (cpu, mem in MB, node,
    billing, gres/gpu, gres/gpu:<type>, license/..., any gres/*), or of TRES only, per
    (cluster, month in ZONE, group, TRES): the TRES's count x the exact overlap of each attempt
    with [START, END) and the month, running attempts up to NOW. What sreport -T ALL -t seconds
    reports per account and user, split at month edges as GPU-seconds are."""
    if by not in TRES_GROUPS:
        raise ValueError(f"--by must be one of {', '.join(TRES_GROUPS)}")
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    column = TRES_GROUPS[by]
    sql = f"""
        SELECT w.cluster, w.{column} AS grp, t.tres,
               sum(CAST(t.count AS numeric)
                   * slurmtel_window_gpu_seconds(1, w.start_at, w.end_at, CAST(:start AS timestamptz),
                                                 CAST(:end AS timestamptz), CAST(:now AS timestamptz)))
                   AS tres_seconds
        FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters) w
        CROSS JOIN LATERAL jsonb_each_text(w.alloc_tres) AS t(tres, count)
        WHERE t.tres <> ALL(CAST(:not_allocated AS text[]))
          AND (cardinality(CAST(:tres AS text[])) = 0 OR t.tres = ANY(CAST(:tres AS text[])))
        GROUP BY w.cluster, w.{column}, t.tres
        HAVING sum(CAST(t.count AS numeric)
                   * slurmtel_window_gpu_seconds(1, w.start_at, w.end_at, CAST(:start AS timestamptz),
                                                 CAST(:end AS timestamptz), CAST(:now AS timestamptz))) > 0
    """
    rows = []
    for month, lo, hi in _month_slices(start, end, zone):
        params: dict[str, Any] = {
            "start": lo,
            "end": hi,
            "now": now,
            "tres": list(tres),
            "not_allocated": sorted(NOT_ALLOCATED_TRES),
        }
        params.update(scope.sql_params())
        params.update((job_filter or JobFilter()).sql_params())
        for r in conn.execute(text(sql), params).mappings():
            rows.append(
                {
                    "cluster": r["cluster"],
                    "month": month,
                    by: r["grp"],
                    "tres": r["tres"],
                    "allocated_tres_seconds": as_seconds(r["tres_seconds"]),
                }
            )
    rows.sort(key=lambda r: (r["cluster"], r["month"], r[by], r["tres"]))
    return rows


def _month_slices(start: datetime, end: datetime, zone: tzinfo) -> list[tuple[str, datetime, datetime]]:
    """[START, END) cut at the month edges of ZONE: (YYYY-MM, slice start, slice end)."""
    slices = []
    month = month_of(start, zone)
    while True:
        lo, hi = month_bounds(month, zone)
        if lo >= end:
            break
        slices.append((month, max(lo, start), min(hi, end)))
        month = next_month(month)
    return slices
