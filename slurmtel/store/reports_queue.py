"""`slurmtel report queue`: queue wait over a window, and what is pending now and why.

Queue wait of an attempt = start − eligible (DESIGN §4), over the attempts that started in the
window: exactly the attempts and figures `report usage` shows (same windowed attempts, same
percentiles, linear interpolation). Pending now = the pending_job rows seen in each cluster's
latest controller snapshot; their wait so far = snapshot time − eligible (submit when Slurm
gives no eligible time). Reasons that are quota refusals (association or QOS limits:
AssocGrp*, AssocMax*, QOSGrp*, QOSMax*) are reported apart from resource and priority waits.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.reports_admin import no_jit, params, seconds_value
from slurmtel.store.sql import Connection, text

SECTIONS = ("wait_by_partition", "wait_by_account", "pending", "quota")
QUOTA_REASON_PREFIXES = ("AssocGrp", "AssocMax", "QOSGrp", "QOSMax")

# the attempts whose wait `report usage` counts (keep the two in step: tests compare them)
WAITS_SQL = """
    SELECT cluster, partition, account, extract(epoch FROM start_at - eligible_at) AS wait_seconds
    FROM (SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)) w
    WHERE start_at >= CAST(:start AS timestamptz) AND start_at < CAST(:end AS timestamptz)
      AND eligible_at IS NOT NULL AND start_at >= eligible_at
"""


def is_quota_reason(reason: str) -> bool:
    return reason.startswith(QUOTA_REASON_PREFIXES)


def queue_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    scope: Scope,
    job_filter: JobFilter | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Wait count, p50, p95, max by partition and by account; pending now by partition and
    reason (`pending`) and quota refusals by account, partition and reason (`quota`)."""
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    sql = f"""
        WITH waits AS ({WAITS_SQL})
        SELECT CASE WHEN grouping(partition) = 0 THEN 'wait_by_partition' ELSE 'wait_by_account' END
                   AS section,
               cluster, coalesce(partition, account) AS grp, NULL AS reason, count(*) AS n,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_seconds) AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_seconds) AS p95,
               max(wait_seconds) AS mx, avg(wait_seconds) AS mean,
               NULL::bigint AS gpus, NULL::bigint AS users, NULL AS account, NULL::timestamptz AS observed_at
        FROM waits
        GROUP BY GROUPING SETS ((cluster, partition), (cluster, account))
        UNION ALL
        SELECT CASE WHEN q.quota THEN 'quota' ELSE 'pending' END, q.cluster, q.partition, q.reason,
               count(*), NULL, NULL, max(q.wait_seconds), avg(q.wait_seconds),
               sum(q.gpus_requested), count(DISTINCT q.user_name),
               CASE WHEN q.quota THEN q.account END, max(q.observed_at)
        FROM (
            SELECT p.*, s.observed_at,
                   p.reason LIKE ANY (CAST(:quota_patterns AS text[])) AS quota,
                   greatest(0, extract(epoch FROM s.observed_at - coalesce(p.eligible_at, p.submit_at)))
                       AS wait_seconds
            FROM pending_job p JOIN controller_snapshot s USING (cluster)
            WHERE p.last_seen_at = s.observed_at
              AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
              AND slurmtel_job_filter(cluster, account, user_name, partition, :f_accounts, :f_users, :f_partitions, :f_clusters)
        ) q
        GROUP BY q.quota, q.cluster, q.partition, q.reason, CASE WHEN q.quota THEN q.account END
    """
    bind = params(
        scope,
        job_filter,
        start=start,
        end=end,
        now=now,
        quota_patterns=[f"{p}%" for p in QUOTA_REASON_PREFIXES],
    )
    sections: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    no_jit(conn)
    for r in conn.execute(text(sql), bind).mappings():
        section = r["section"]
        if section.startswith("wait_"):
            key = section.removeprefix("wait_by_")
            sections[section].append(
                {
                    "cluster": r["cluster"],
                    key: r["grp"],
                    "queue_wait_count": int(r["n"]),
                    "queue_wait_p50_seconds": seconds_value(r["p50"]),
                    "queue_wait_p95_seconds": seconds_value(r["p95"]),
                    "queue_wait_max_seconds": seconds_value(r["mx"]),
                    "queue_wait_mean_seconds": seconds_value(r["mean"]),
                }
            )
            continue
        row: dict[str, Any] = {"cluster": r["cluster"]}
        if section == "quota":
            row["account"] = r["account"]
        row.update(
            {
                "partition": r["grp"],
                "reason": r["reason"],
                "jobs": int(r["n"]),
                "users": int(r["users"]),
                "gpus_requested": int(r["gpus"] or 0),
                "oldest_pending_seconds": seconds_value(r["mx"]),
                "mean_pending_seconds": seconds_value(r["mean"]),
                "observed_at": r["observed_at"],
            }
        )
        sections[section].append(row)
    for name in ("wait_by_partition", "wait_by_account"):
        key = name.removeprefix("wait_by_")
        sections[name].sort(key=lambda g: (g["cluster"], g[key]))
    for name in ("pending", "quota"):
        sections[name].sort(
            key=lambda g: (g["cluster"], -g["gpus_requested"], -g["jobs"], g["partition"], g["reason"])
        )
    return sections
