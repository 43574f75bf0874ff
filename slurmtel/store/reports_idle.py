"""`slurmtel report idle`: where allocated GPUs sit idle, from the attribution rollup.

Whole site days (gpu_attribution is per day), physical GPU-hours (× gpu_fraction). Per
group: allocated = covered + unmeasured; covered = busy + idle; idle includes no-process time
(no_process is shown as its own "of which" column); unmeasured is never folded into idle or
busy. idle_share = idle / covered, covered_share = covered / allocated, mean_util_share =
Σ covered × util / Σ covered (a fraction). `unmapped`: allocation no GPU could be mapped to (attribution's
'unmapped' rows, all unmeasured), by account.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.reports_admin import as_seconds, no_jit, params, share
from slurmtel.store.reports_retries import job_scope_params
from slurmtel.store.sql import Connection, text
from slurmtel.vocabulary import IDLE_CAUSES

SECTIONS = ("by_account", "by_user", "by_partition", "top_jobs", "unmapped")

_SUMS = """
    sum(allocated) AS allocated, sum(covered) AS covered, sum(busy) AS busy, sum(idle) AS idle,
    sum(no_process) AS no_process, sum(unmeasured) AS unmeasured, sum(util_weighted) AS util_weighted,
    sum(unmapped) AS unmapped
"""


def idle_report(
    conn: Connection,
    *,
    first_day: date,
    last_day: date,
    scope: Scope,
    job_scope: Scope | None = None,
    job_filter: JobFilter | None = None,
    top: int = 10,
) -> dict[str, list[dict[str, Any]]]:
    """Idle, no-process, busy and unmeasured GPU-hours by account, user, partition (SCOPE),
    the TOP attempts by idle GPU-hours (JOB_SCOPE, default SCOPE) and unmapped allocation."""
    if last_day < first_day:
        raise ValueError("the window is empty: -E must be after -S")
    job_scope = job_scope or scope
    sql = f"""
        WITH per_attempt AS (
            -- one row per attempt (the rollup has one per node and day, each with the
            -- attempt's account, user, partition and state: migration 0013)
            SELECT cluster, job_id_raw, submit_at, account, user_name, partition,
                   sum(allocated_seconds) AS allocated,
                   sum(covered_seconds) AS covered,
                   sum(busy_seconds) AS busy,
                   sum(idle_seconds) AS idle,
                   sum(no_process_seconds) AS no_process,
                   sum(unmeasured_seconds) AS unmeasured,
                   sum(util_weighted_sum) AS util_weighted,
                   sum(unmapped_seconds) AS unmapped
            FROM attempt_node_day
            WHERE day >= :first_day AND day <= :last_day
              AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
              AND slurmtel_job_filter(cluster, account, user_name, partition, :f_accounts, :f_users, :f_partitions, :f_clusters)
            GROUP BY cluster, job_id_raw, submit_at, account, user_name, partition
        ),
        top_attempt AS (
            -- the job id, GPUs and state of the top attempts only
            SELECT t.*, a.job_id, a.alloc_gpus, a.state
            FROM (
                SELECT * FROM per_attempt
                WHERE idle > 0
                  AND (CAST(:job_scope_all AS boolean) OR user_name = ANY(CAST(:job_scope_users AS text[]))
                       OR account = ANY(CAST(:job_scope_accounts AS text[])))
                ORDER BY idle DESC, cluster, job_id_raw, submit_at
                LIMIT :top
            ) t
            JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
        )
        SELECT CASE WHEN grouping(account) = 0 THEN 'by_account'
                    WHEN grouping(user_name) = 0 THEN 'by_user' ELSE 'by_partition' END AS section,
               cluster, coalesce(account, user_name, partition) AS grp, {_SUMS},
               NULL AS user_name_, NULL AS account_, NULL AS partition_, NULL::integer AS gpus,
               NULL AS state
        FROM per_attempt
        GROUP BY GROUPING SETS ((cluster, account), (cluster, user_name), (cluster, partition))
        UNION ALL
        SELECT 'top_jobs', cluster, job_id, allocated, covered, busy, idle, no_process, unmeasured,
               util_weighted, unmapped, user_name, account, partition, alloc_gpus, state
        FROM top_attempt
    """
    bind = params(scope, job_filter, first_day=first_day, last_day=last_day, top=max(0, int(top)))
    bind.update(job_scope_params(job_scope))
    sections: dict[str, list[dict[str, Any]]] = {name: [] for name in SECTIONS}
    no_jit(conn)
    for r in conn.execute(text(sql), bind).mappings():
        section = r["section"]
        if section == "top_jobs":
            sections[section].append(
                {
                    "cluster": r["cluster"],
                    "job_id": r["grp"],
                    "user": r["user_name_"],
                    "account": r["account_"],
                    "partition": r["partition_"],
                    "state": r["state"],
                    "gpus": int(r["gpus"]),
                    "allocated_gpu_seconds": as_seconds(r["allocated"]),
                    "idle_gpu_seconds": as_seconds(r["idle"]),
                    "no_process_gpu_seconds": as_seconds(r["no_process"]),
                    "idle_share": share(r["idle"], r["covered"]),
                    "covered_share": share(r["covered"], r["allocated"]),
                    "mean_util_share": _mean_util(r),
                    "_rank": float(r["idle"]),
                }
            )
            continue
        key = section.removeprefix("by_")
        sections[section].append({"cluster": r["cluster"], key: r["grp"], **_group_values(r)})
        if section == "by_account" and r["unmapped"] > 0:
            sections["unmapped"].append(
                {
                    "cluster": r["cluster"],
                    "account": r["grp"],
                    "unmapped_gpu_seconds": as_seconds(r["unmapped"]),
                    "allocated_gpu_seconds": as_seconds(r["allocated"]),
                    "unmapped_share": share(r["unmapped"], r["allocated"]),
                }
            )
    for name in ("by_account", "by_user", "by_partition"):
        key = name.removeprefix("by_")
        sections[name].sort(key=lambda g: (g["cluster"], -g["idle_gpu_seconds"], g[key]))
    sections["unmapped"].sort(key=lambda g: (g["cluster"], -g["unmapped_gpu_seconds"], g["account"]))
    sections["top_jobs"].sort(key=lambda t: (-t["_rank"], t["cluster"], t["job_id"]))
    for t in sections["top_jobs"]:
        del t["_rank"]
    return sections


def _group_values(r: Any) -> dict[str, Any]:
    return {
        "allocated_gpu_seconds": as_seconds(r["allocated"]),
        "covered_gpu_seconds": as_seconds(r["covered"]),
        "busy_gpu_seconds": as_seconds(r["busy"]),
        "idle_gpu_seconds": as_seconds(r["idle"]),
        "no_process_gpu_seconds": as_seconds(r["no_process"]),
        "unmeasured_gpu_seconds": as_seconds(r["unmeasured"]),
        "idle_share": share(r["idle"], r["covered"]),
        "covered_share": share(r["covered"], r["allocated"]),
        "mean_util_share": _mean_util(r),
    }


def _mean_util(r: Any) -> float | None:
    # util_weighted_sum is Σ covered seconds × util percent
    return share(float(r["util_weighted"] or 0) / 100, r["covered"], places=4)


# ---------------------------------------------------------------- idle GPU time by cause

CAUSES = IDLE_CAUSES
# the column each cause is reported in
CAUSE_COLUMNS = {
    "no_process": "no_process_gpu_seconds",
    "hardware": "idle_hardware_gpu_seconds",
    "storage_wait": "idle_storage_wait_gpu_seconds",
    "network_wait": "idle_network_wait_gpu_seconds",
    "cpu_bound": "idle_cpu_bound_gpu_seconds",
    "idle_unexplained": "idle_unexplained_gpu_seconds",
    "unmeasured": "idle_unmeasured_gpu_seconds",
}
_RAW = ", ".join(f"sum(cause_{c}_seconds) AS raw_{c}" for c in CAUSES)
_RAW_COLUMNS = ", ".join(f"p.raw_{c}" for c in CAUSES)
_RAW_TOTAL = " + ".join(f"coalesce(raw_{c}, 0)" for c in CAUSES)


# each GPU-day's idle time (as report idle counts it) split in the proportions of its causes;
# a GPU-day without cause rows (windows from before issue 26, DCGM's) splits into its
# no-process time and unmeasured
def _scaled(prefix: str = "") -> str:
    return ",\n".join(
        f"sum(CASE WHEN raw_total > 0 THEN idle * coalesce(raw_{c}, 0) / raw_total "
        + (
            "ELSE least(no_process, idle) END)"
            if c == "no_process"
            else "ELSE greatest(0, idle - least(no_process, idle)) END)"
            if c == "unmeasured"
            else "ELSE 0 END)"
        )
        + f" AS {prefix}{c}"
        for c in CAUSES
    )


_SCALED = _scaled()


def idle_cause_rows(
    conn: Connection,
    *,
    first_day: date,
    last_day: date,
    scope: Scope,
    job_filter: JobFilter | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Idle GPU time split by cause: per cause (by_cause), and per account, user and partition
    with a column per cause. Each group's causes add up to the idle GPU time `report idle`
    gives it (the same gpu_attribution rows, × gpu_fraction; rounding residue to its largest)."""
    sql = f"""
        WITH parts AS (
            SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, day, {_RAW}
            FROM gpu_attribution_part
            WHERE day >= :first_day AND day <= :last_day
            GROUP BY cluster, job_id_raw, submit_at, node, gpu_uuid, day
        ),
        gpu_days AS (
            SELECT a.cluster, a.account, a.user_name, a.partition,
                   g.idle_seconds * g.gpu_fraction AS idle,
                   g.no_process_seconds * g.gpu_fraction AS no_process,
                   {_RAW_COLUMNS}, {_RAW_TOTAL} AS raw_total
            FROM gpu_attribution g
            JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
            LEFT JOIN parts p USING (cluster, job_id_raw, submit_at, node, gpu_uuid, day)
            WHERE g.day >= :first_day AND g.day <= :last_day AND g.idle_seconds > 0
              AND slurmtel_in_scope(a.user_name, a.account, :scope_all, :scope_users, :scope_accounts)
              AND slurmtel_job_filter(a.cluster, a.account, a.user_name, a.partition,
                                      :f_accounts, :f_users, :f_partitions, :f_clusters)
        )
        SELECT CASE WHEN grouping(account) = 0 THEN 'by_account'
                    WHEN grouping(user_name) = 0 THEN 'by_user'
                    WHEN grouping(partition) = 0 THEN 'by_partition' ELSE 'by_cause' END AS section,
               cluster, coalesce(account, user_name, partition) AS grp, sum(idle) AS idle, {_SCALED}
        FROM gpu_days
        GROUP BY GROUPING SETS ((cluster, account), (cluster, user_name), (cluster, partition), (cluster))
    """
    sections: dict[str, list[dict[str, Any]]] = {
        "by_cause": [],
        "by_account": [],
        "by_user": [],
        "by_partition": [],
    }
    no_jit(conn)
    for r in conn.execute(
        text(sql), params(scope, job_filter, first_day=first_day, last_day=last_day)
    ).mappings():
        idle = as_seconds(r["idle"])
        parts = _exact_parts(idle, {c: float(r[c] or 0) for c in CAUSES})
        if r["section"] == "by_cause":
            for cause in CAUSES:
                sections["by_cause"].append(
                    {
                        "cluster": r["cluster"],
                        "idle_cause": cause,
                        "idle_gpu_seconds": parts[cause],
                        "idle_cause_share": share(parts[cause], idle),
                    }
                )
            continue
        key = r["section"].removeprefix("by_")
        sections[r["section"]].append(
            {
                "cluster": r["cluster"],
                key: r["grp"],
                "idle_gpu_seconds": idle,
                **{CAUSE_COLUMNS[c]: parts[c] for c in CAUSES},
            }
        )
    for name in ("by_account", "by_user", "by_partition"):
        key = name.removeprefix("by_")
        sections[name].sort(key=lambda g: (g["cluster"], -g["idle_gpu_seconds"], g[key]))
    sections["by_cause"].sort(key=lambda g: (g["cluster"], CAUSES.index(g["idle_cause"])))
    return sections


def _exact_parts(total: int | float, raw: dict[str, float]) -> dict[str, int | float]:
    """RAW rounded as report seconds, the rounding residue given to the largest part, so the
    parts add up to TOTAL exactly as printed."""
    parts = {c: as_seconds(v) for c, v in raw.items()}
    residue = round(float(total) - sum(float(v) for v in parts.values()), 3)
    if residue and parts:
        largest = max(parts, key=lambda c: (float(parts[c]), -CAUSES.index(c)))
        parts[largest] = as_seconds(round(float(parts[largest]) + residue, 3))
    return parts


def attempt_idle_causes(
    conn: Connection, keys: Sequence[tuple[str, int, datetime]]
) -> dict[tuple[str, int, datetime], list[dict[str, Any]]]:
    """Each attempt's idle GPU time by cause (the job view): rows of idle_cause,
    idle_gpu_seconds, idle_cause_share adding up to its idle GPU time. KEYS are attempts the
    caller may see (found through find_attempts)."""
    if not keys:
        return {}
    sql = f"""
        WITH wanted AS (
            SELECT * FROM unnest(CAST(:clusters AS text[]), CAST(:raws AS bigint[]),
                                 CAST(:submits AS timestamptz[])) AS k(cluster, job_id_raw, submit_at)
        ),
        {attempt_causes_sql("wanted")}
        SELECT * FROM attempt_causes
    """
    bind = {
        "clusters": [k[0] for k in keys],
        "raws": [k[1] for k in keys],
        "submits": [k[2] for k in keys],
    }
    return {
        (r["cluster"], r["job_id_raw"], r["submit_at"]): causes_of_row(r)
        for r in conn.execute(text(sql), bind).mappings()
    }


def attempt_causes_sql(wanted: str, prefix: str = "") -> str:
    """CTEs ending in attempt_causes: per attempt of the CTE WANTED (cluster, job_id_raw,
    submit_at) with idle GPU time, PREFIX + "idle" and PREFIX + each cause of CAUSES, the
    seconds causes_of_row reads (an attempt without idle time has no row)."""
    return f"""
        cause_parts AS (
            SELECT p.cluster, p.job_id_raw, p.submit_at, p.node, p.gpu_uuid, p.day, {_RAW}
            FROM gpu_attribution_part p JOIN {wanted} USING (cluster, job_id_raw, submit_at)
            GROUP BY p.cluster, p.job_id_raw, p.submit_at, p.node, p.gpu_uuid, p.day
        ),
        cause_gpu_days AS (
            SELECT g.cluster, g.job_id_raw, g.submit_at, g.idle_seconds * g.gpu_fraction AS idle,
                   g.no_process_seconds * g.gpu_fraction AS no_process,
                   {_RAW_COLUMNS}, {_RAW_TOTAL} AS raw_total
            FROM gpu_attribution g JOIN {wanted} USING (cluster, job_id_raw, submit_at)
            LEFT JOIN cause_parts p USING (cluster, job_id_raw, submit_at, node, gpu_uuid, day)
            WHERE g.idle_seconds > 0
        ),
        attempt_causes AS (
            SELECT cluster, job_id_raw, submit_at, sum(idle) AS {prefix}idle,
                   {_scaled(prefix)}
            FROM cause_gpu_days GROUP BY cluster, job_id_raw, submit_at
        )
    """


def causes_of_row(r: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """The attempt's idle_by_cause rows from a row of attempt_causes_sql's attempt_causes."""
    idle = as_seconds(r[f"{prefix}idle"])
    parts = _exact_parts(idle, {c: float(r[f"{prefix}{c}"] or 0) for c in CAUSES})
    return [
        {"idle_cause": c, "idle_gpu_seconds": parts[c], "idle_cause_share": share(parts[c], idle)}
        for c in CAUSES
    ]


# ---------------------------------------------------------------- checkpoints and start-up, fleet-wide

_CHECKPOINT_SUMS = """
    count(*) AS jobs, sum(c.episodes) AS episodes, sum(c.checkpoint_gpu_seconds) AS checkpoint,
    sum(c.checkpoint_write_bytes) AS written, sum(c.startup_gpu_seconds) AS startup,
    sum(c.startup_read_bytes) AS read
"""


def checkpoint_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    scope: Scope,
    job_filter: JobFilter | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """GPU time spent checkpointing and starting up (estimates, docs/idle-causes.md) of the
    attempts that ended in [START, END) and have host signals, by account and partition."""
    sql = f"""
        SELECT CASE WHEN grouping(a.account) = 0 THEN 'by_account' ELSE 'by_partition' END AS section,
               a.cluster, coalesce(a.account, a.partition) AS grp, {_CHECKPOINT_SUMS}
        FROM job_checkpoint c JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
        WHERE a.end_at >= :start AND a.end_at < :end
          AND slurmtel_in_scope(a.user_name, a.account, :scope_all, :scope_users, :scope_accounts)
          AND slurmtel_job_filter(a.cluster, a.account, a.user_name, a.partition,
                                  :f_accounts, :f_users, :f_partitions, :f_clusters)
        GROUP BY GROUPING SETS ((a.cluster, a.account), (a.cluster, a.partition))
    """
    sections: dict[str, list[dict[str, Any]]] = {"by_account": [], "by_partition": []}
    no_jit(conn)
    for r in conn.execute(text(sql), params(scope, job_filter, start=start, end=end)).mappings():
        key = r["section"].removeprefix("by_")
        sections[r["section"]].append(
            {
                "cluster": r["cluster"],
                key: r["grp"],
                "jobs": int(r["jobs"]),
                "checkpoint_episodes": int(r["episodes"] or 0),
                "checkpoint_gpu_seconds": as_seconds(r["checkpoint"]),
                "checkpoint_write_bytes": int(r["written"] or 0),
                "startup_gpu_seconds": as_seconds(r["startup"]),
                "startup_read_bytes": int(r["read"] or 0),
            }
        )
    for name, rows in sections.items():
        key = name.removeprefix("by_")
        rows.sort(
            key=lambda g: (g["cluster"], -(g["checkpoint_gpu_seconds"] + g["startup_gpu_seconds"]), g[key])
        )
    return sections
