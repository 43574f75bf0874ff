"""`slurmtel report failures`: GPU-hours that ended in failure, and where.

GPU-hours are allocated GPU-seconds inside the window (as in `report usage`) of the attempts
that held GPUs in it, by outcome class: failed = user_failure + system_failure; cancelled and
preempted are shown for context. By node, a multi-node attempt's GPU-seconds are split evenly
over its nodes. retry GPU-hours: see slurmtel.store.reports_retries.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.reports_admin import as_seconds, no_jit, params, share
from slurmtel.store.reports_retries import (
    DEFAULT_RESUBMISSION_WINDOW_SECONDS,
    job_scope_params,
    retry_ctes,
)
from slurmtel.store.sql import Connection, text

SECTIONS = ("by_account", "by_user", "by_partition", "by_node", "top_attempts")


def _sums(count: str = "count(*)") -> str:
    """The figures of a group of rows with outcome, is_retry and gpu_seconds; COUNT is how
    many attempts the group's rows are (count(*) of attempts, sum(n) of groups of them)."""
    return f"""
    CAST(coalesce({count} FILTER (WHERE slurmtel_failed(outcome)), 0) AS bigint) AS failed_attempts,
    coalesce(sum(gpu_seconds) FILTER (WHERE slurmtel_failed(outcome)), 0) AS failed,
    coalesce(sum(gpu_seconds) FILTER (WHERE outcome = 'user_failure'), 0) AS user_failure,
    coalesce(sum(gpu_seconds) FILTER (WHERE outcome = 'system_failure'), 0) AS system_failure,
    coalesce(sum(gpu_seconds) FILTER (WHERE outcome = 'cancelled'), 0) AS cancelled,
    coalesce(sum(gpu_seconds) FILTER (WHERE outcome = 'preempted'), 0) AS preempted,
    coalesce(sum(gpu_seconds), 0) AS allocated,
    coalesce(sum(gpu_seconds) FILTER (WHERE is_retry), 0) AS retry
"""


def failures_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    scope: Scope,
    job_scope: Scope | None = None,
    job_filter: JobFilter | None = None,
    top: int = 10,
    resubmission_window_seconds: int = DEFAULT_RESUBMISSION_WINDOW_SECONDS,
) -> dict[str, list[dict[str, Any]]]:
    """Failed GPU-hours by account, user, partition and node (SCOPE), and the TOP attempts by
    failed GPU-hours (JOB_SCOPE, default SCOPE: job detail)."""
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    job_scope = job_scope or scope
    bind = params(
        scope,
        job_filter,
        start=start,
        end=end,
        now=now,
        top=max(0, int(top)),
        resubmission_seconds=resubmission_window_seconds,
    )
    bind.update(job_scope_params(job_scope))
    no_jit(conn)
    ctes = retry_ctes(conn, bind, detail=True)
    sql = f"""
        WITH {ctes},
        fw AS (
            SELECT * FROM w WHERE gpu_seconds > 0
        ),
        -- the attempts summed per owner and per node list first (hundreds of groups, not
        -- 170,000 attempts three times over), then per account, user, partition and node
        owner_group AS (
            SELECT cluster, account, user_name, partition, outcome, is_retry, count(*) AS n,
                   sum(gpu_seconds) AS gpu_seconds
            FROM fw GROUP BY cluster, account, user_name, partition, outcome, is_retry
        ),
        node_group AS (
            SELECT cluster, nodes, outcome, is_retry, count(*) AS n, sum(gpu_seconds) AS gpu_seconds
            FROM fw GROUP BY cluster, nodes, outcome, is_retry
        ),
        per_node AS (
            SELECT cluster, unnest(CASE WHEN cardinality(nodes) = 0 THEN ARRAY[''] ELSE nodes END) AS node,
                   outcome, is_retry, n, gpu_seconds / greatest(cardinality(nodes), 1) AS gpu_seconds
            FROM node_group
        ),
        top_attempt AS (
            -- the job id, exit code and node list of these few only
            SELECT t.*, d.job_id, d.exit_code, d.nodelist
            FROM (
                SELECT * FROM fw
                WHERE slurmtel_failed(outcome)
                  AND (CAST(:job_scope_all AS boolean) OR user_name = ANY(CAST(:job_scope_users AS text[]))
                       OR account = ANY(CAST(:job_scope_accounts AS text[])))
                ORDER BY gpu_seconds DESC, cluster, job_id_raw, submit_at
                LIMIT :top
            ) t
            CROSS JOIN LATERAL (
                SELECT a.job_id, a.exit_code, a.nodelist FROM job_attempt a
                WHERE a.cluster = t.cluster AND a.job_id_raw = t.job_id_raw AND a.submit_at = t.submit_at
            ) d
        )
        SELECT CASE WHEN grouping(account) = 0 THEN 'by_account'
                    WHEN grouping(user_name) = 0 THEN 'by_user' ELSE 'by_partition' END AS section,
               cluster, coalesce(account, user_name, partition) AS grp, {_sums("sum(n)")}, NULL::jsonb AS detail
        FROM owner_group
        GROUP BY GROUPING SETS ((cluster, account), (cluster, user_name), (cluster, partition))
        UNION ALL
        SELECT 'by_node', cluster, node, {_sums("sum(n)")}, NULL
        FROM per_node GROUP BY cluster, node
        UNION ALL
        SELECT 'top_attempts', cluster, job_id, {_sums()},
               jsonb_build_object(
                   'user', min(user_name), 'account', min(account), 'partition', min(partition),
                   'state', min(state), 'outcome', min(outcome), 'exit_code', min(exit_code),
                   'nodes', min(coalesce(nullif(nodelist, ''), array_to_string(nodes, ','))), 'gpus', min(alloc_gpus),
                   'elapsed_seconds',
                   min(extract(epoch FROM coalesce(end_at, CAST(:now AS timestamptz)) - start_at)))
        FROM top_attempt GROUP BY cluster, job_id_raw, submit_at, job_id
    """
    sections: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    for r in conn.execute(text(sql), bind).mappings():
        section = r["section"]
        sums = {
            "failed_attempts": int(r["failed_attempts"]),
            "failed_gpu_seconds": as_seconds(r["failed"]),
            "user_failure_gpu_seconds": as_seconds(r["user_failure"]),
            "system_failure_gpu_seconds": as_seconds(r["system_failure"]),
            "cancelled_gpu_seconds": as_seconds(r["cancelled"]),
            "preempted_gpu_seconds": as_seconds(r["preempted"]),
            "allocated_gpu_seconds": as_seconds(r["allocated"]),
            "failed_share": share(r["failed"], r["allocated"]),
            "retry_gpu_seconds": as_seconds(r["retry"]),
        }
        if section == "top_attempts":
            d = r["detail"]
            sections[section].append(
                {
                    "cluster": r["cluster"],
                    "job_id": r["grp"],
                    "user": d["user"],
                    "account": d["account"],
                    "partition": d["partition"],
                    "state": d["state"],
                    "outcome": d["outcome"],
                    "exit_code": d["exit_code"],
                    "nodes": d["nodes"],
                    "gpus": int(d["gpus"]),
                    "elapsed_seconds": int(float(d["elapsed_seconds"])),
                    "failed_gpu_seconds": sums["failed_gpu_seconds"],
                    "retry": bool(r["retry"]),
                    "_rank": float(r["failed"]),
                }
            )
            continue
        key = section.removeprefix("by_")
        sections[section].append({"cluster": r["cluster"], key: r["grp"], **sums})
    for name in ("by_account", "by_user", "by_partition", "by_node"):
        key = name.removeprefix("by_")
        sections[name].sort(key=lambda g: (g["cluster"], -g["failed_gpu_seconds"], g[key]))
    sections["top_attempts"].sort(key=lambda t: (-t["_rank"], t["cluster"], t["job_id"]))
    for t in sections["top_attempts"]:
        del t["_rank"]
    return sections
