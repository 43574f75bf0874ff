"""`slurmtel report nodes`: which nodes fail jobs, log GPU errors or run drifted software.

Per (cluster, node): attempts that ran on it and were active in the window, failed ones
(user_failure + system_failure), NODE_FAIL ones, failed GPU-hours (a multi-node attempt's split
evenly over its nodes); XID events by code and ECC events in the window (gpu_event); GPU model,
GPU count, driver and CUDA version from the node's latest inventory (the most common value
among the GPUs of its newest inventory observation); its latest Slurm state. Drift: a driver or
CUDA version that differs from the most common one across the cluster's nodes (ties: the
lexically smallest wins). Nodes known only from inventory or events (no Slurm record) have
cluster ''.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.reports_admin import as_seconds, no_jit, params
from slurmtel.store.sql import Connection, text


def nodes_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    scope: Scope,
    job_filter: JobFilter | None = None,
) -> list[dict[str, Any]]:
    """One row per node. Cluster-wide: a scope short of everything gets no rows."""
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    if job_filter is not None and (job_filter.accounts or job_filter.users):
        raise ValueError("the nodes report is cluster-wide: -A/-u do not apply")
    if not scope.everything:
        return []
    f = job_filter or JobFilter()
    # attempts are not filtered by partition here: -r selects nodes (below), not attempts
    sql = """
        WITH on_node AS (
            -- narrow, each attempt's GPU-seconds computed once (OFFSET 0), not per sum, and
            -- unnest in the select list (one ProjectSet), not a function scan per attempt
            SELECT w.cluster, unnest(w.nodes) AS node, w.partition, w.outcome, w.state,
                   w.gpu_seconds / cardinality(w.nodes) AS gpu_seconds
            FROM (
                SELECT cluster, partition, outcome, state, nodes, gpu_seconds
                FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)
                WHERE start_at IS NOT NULL AND cardinality(nodes) > 0
                OFFSET 0
            ) w
        ),
        node_partition AS (
            -- per partition first (hashed), then per node: the partitions come out distinct
            -- and sorted, as array_agg(DISTINCT) gave them
            SELECT cluster, node, partition, count(*) AS attempts,
                   count(*) FILTER (WHERE slurmtel_failed(outcome)) AS failed,
                   count(*) FILTER (WHERE state = 'NODE_FAIL') AS node_fail,
                   coalesce(sum(gpu_seconds) FILTER (WHERE slurmtel_failed(outcome)), 0) AS failed_seconds,
                   coalesce(sum(gpu_seconds), 0) AS allocated_seconds
            FROM on_node GROUP BY cluster, node, partition
        ),
        attempts AS (
            SELECT cluster, node, CAST(sum(attempts) AS bigint) AS attempts,
                   CAST(sum(failed) AS bigint) AS failed, CAST(sum(node_fail) AS bigint) AS node_fail,
                   sum(failed_seconds) AS failed_seconds,
                   sum(allocated_seconds) AS allocated_seconds,
                   array_agg(partition ORDER BY partition) AS partitions
            FROM node_partition GROUP BY cluster, node
        ),
        state_now AS (
            SELECT DISTINCT ON (cluster, node) cluster, node, states, partitions, reason, gpus_total
            FROM node_state
            WHERE cardinality(CAST(:f_clusters AS text[])) = 0 OR cluster = ANY(CAST(:f_clusters AS text[]))
            ORDER BY cluster, node, last_seen_at DESC
        ),
        inventory_now AS (
            SELECT i.node, mode() WITHIN GROUP (ORDER BY i.model) AS model,
                   mode() WITHIN GROUP (ORDER BY i.driver_version) AS driver_version,
                   mode() WITHIN GROUP (ORDER BY i.cuda_version) AS cuda_version,
                   count(DISTINCT i.gpu_uuid) FILTER (WHERE i.parent_gpu_uuid = '') AS gpus
            FROM gpu_inventory i
            JOIN (SELECT node, max(last_seen_at) AS at FROM gpu_inventory GROUP BY node) l
              ON l.node = i.node AND i.last_seen_at = l.at
            GROUP BY i.node
        ),
        events AS (
            SELECT node,
                   count(*) FILTER (WHERE kind = 'xid') AS xid,
                   count(*) FILTER (WHERE kind = 'ecc_single_bit') AS ecc_single,
                   count(*) FILTER (WHERE kind = 'ecc_double_bit') AS ecc_double
            FROM gpu_event
            WHERE at >= CAST(:start AS timestamptz) AND at < CAST(:end AS timestamptz)
            GROUP BY node
        ),
        xid_codes AS (
            SELECT node, string_agg(value || ':' || n, ' ' ORDER BY n DESC, value) AS codes
            FROM (
                SELECT node, value, count(*) AS n FROM gpu_event
                WHERE kind = 'xid' AND at >= CAST(:start AS timestamptz) AND at < CAST(:end AS timestamptz)
                GROUP BY node, value
            ) c
            GROUP BY node
        ),
        slurm_node AS (
            SELECT cluster, node FROM attempts UNION SELECT cluster, node FROM state_now
        ),
        node_list AS (
            SELECT cluster, node FROM slurm_node
            UNION
            SELECT '', x.node
            FROM (SELECT node FROM inventory_now UNION SELECT node FROM events) x
            WHERE NOT EXISTS (SELECT 1 FROM slurm_node s WHERE s.node = x.node)
              AND cardinality(CAST(:f_clusters AS text[])) = 0
        ),
        report AS (
            SELECT l.cluster, l.node, s.states, s.partitions, s.reason, s.gpus_total,
                   a.attempts, a.failed, a.node_fail, a.failed_seconds, a.allocated_seconds,
                   a.partitions AS attempt_partitions,
                   e.xid, e.ecc_single, e.ecc_double, x.codes,
                   i.model, i.gpus, nullif(i.driver_version, '') AS driver_version,
                   nullif(i.cuda_version, '') AS cuda_version
            FROM node_list l
            LEFT JOIN state_now s USING (cluster, node)
            LEFT JOIN attempts a USING (cluster, node)
            LEFT JOIN inventory_now i ON i.node = l.node
            LEFT JOIN events e ON e.node = l.node
            LEFT JOIN xid_codes x ON x.node = l.node
            WHERE cardinality(CAST(:f_partitions AS text[])) = 0
               OR s.partitions && CAST(:f_partitions AS text[])
               OR a.partitions && CAST(:f_partitions AS text[])
        ),
        majority AS (
            SELECT cluster,
                   mode() WITHIN GROUP (ORDER BY driver_version) AS driver_version,
                   mode() WITHIN GROUP (ORDER BY cuda_version) AS cuda_version
            FROM report GROUP BY cluster
        )
        SELECT r.*, m.driver_version AS majority_driver, m.cuda_version AS majority_cuda
        FROM report r LEFT JOIN majority m USING (cluster)
        ORDER BY coalesce(r.failed, 0) DESC, coalesce(r.xid, 0) DESC, r.cluster, r.node
    """
    # every attempt counts towards its nodes; -M is the only attempt filter that applies
    attempt_filter = JobFilter(clusters=f.clusters)
    bind = params(scope, attempt_filter, start=start, end=end, now=now)
    bind["f_partitions"] = list(f.partitions)
    rows = []
    no_jit(conn)
    for r in conn.execute(text(sql), bind).mappings():
        driver, cuda = r["driver_version"], r["cuda_version"]
        rows.append(
            {
                "cluster": r["cluster"],
                "node": r["node"],
                "state": "+".join(r["states"]) if r["states"] else None,
                "reason": r["reason"] or None,
                "partitions": list(r["partitions"]) if r["partitions"] else [],
                "attempts": int(r["attempts"] or 0),
                "failed_attempts": int(r["failed"] or 0),
                "node_fail_attempts": int(r["node_fail"] or 0),
                "failed_gpu_seconds": as_seconds(r["failed_seconds"]),
                "allocated_gpu_seconds": as_seconds(r["allocated_seconds"]),
                "xid_events": int(r["xid"] or 0),
                "xid_codes": r["codes"] or "",
                "ecc_single_bit_errors": int(r["ecc_single"] or 0),
                "ecc_double_bit_errors": int(r["ecc_double"] or 0),
                "gpu_model": r["model"] or None,
                "gpus": int(r["gpus"]) if r["gpus"] is not None else r["gpus_total"],
                "driver_version": driver,
                "cuda_version": cuda,
                "driver_drift": driver is not None and driver != r["majority_driver"],
                "cuda_drift": cuda is not None and cuda != r["majority_cuda"],
            }
        )
    return rows
