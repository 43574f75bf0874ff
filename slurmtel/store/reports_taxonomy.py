"""`slurmtel report taxonomy` and `slurmtel report capacity`: where every installed GPU-hour went.

Per site day, cluster and partition, every installed GPU-second falls in exactly one of
unavailable, unallocated, allocated_no_process, allocated_idle, active, unmeasured (DESIGN §4).
All arithmetic is PostgreSQL numeric, so the parts add up to `installed` exactly. Rules:

- capacity: node_state rows as intervals: a row holds from its first_seen_at until the node's
  next row's first_seen_at; the node's last row until last_seen_at + the slurmctld poll
  interval (never past now). capacity = gpus_total × time, cut at site-day boundaries. Rows
  are looked up for nodes observed within the days (plus each such node's row before them).
- unavailable = capacity time while the node's states include one of DOWN_STATES.
- allocated parts, per node-day, from gpu_attribution × gpu_fraction (summed as the rollup's
  float8, then numeric; read from its sums per node-day, partition and state,
  node_day_allocation):
  allocated_no_process = no_process; allocated_idle = max(0, idle − no_process);
  active = max(0, covered − max(idle, no_process)); unmeasured = unmeasured.
- over-allocation: when a node-day's allocated total exceeds its available time (capacity −
  unavailable), its allocated parts are scaled down proportionally to fit exactly (cumulative
  rounding to 1e-9 s, so the scaled parts still add up to the available time exactly).
- unallocated = available − allocated (after fitting).
- partitions: allocated parts go to the attempt's partition; unavailable and unallocated to
  the node's first listed partition (of its last state that day). A partition's `installed`
  is therefore the sum of what was assigned to it; per cluster and day, Σ installed over
  partitions = Σ node capacity exactly.
- node-days with attributed allocation but no node_state: installed := allocated (nothing
  unavailable or unallocated), reported in `capacity_unknown_gpu_seconds`.

Capacity (DESIGN §1): the breakdown is the taxonomy's parts over the window (the same CTEs,
so its unavailable, unallocated, allocated_no_process, allocated_idle and unmeasured equal the
taxonomy's sums exactly), with active split by the attempt's outcome: useful (completed),
active_failed (user_failure, system_failure: work thrown away), active_other (cancelled,
preempted, running, unknown). failed GPU-seconds (everything allocated to failed attempts,
idle included) and retry GPU-seconds (allocated to retry attempts, see reports_retries, fitted
like the rest of their node-day) overlap those categories and are shown apart.
useful_gpu_seconds_per_gpu_month = useful / installed × the window's seconds / its calendar
months (slurmtel.months.per_gpu_month, the definition report cost uses too);
required_gpus = target useful GPU-seconds per month / useful_gpu_seconds_per_gpu_month.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.months import exact_seconds, months_in, per_gpu_month
from slurmtel.store.reports_admin import apportion_seconds, no_jit, params
from slurmtel.store.reports_retries import DEFAULT_RESUBMISSION_WINDOW_SECONDS, retry_ctes
from slurmtel.store.sql import Connection, text

# a node whose states include one of these is unavailable (scontrol spells MAINT and INVAL,
# the JSON views MAINTENANCE and INVALID / INVALID_REG)
DOWN_STATES = (
    "DOWN",
    "DRAIN",
    "DRAINED",
    "FAIL",
    "NOT_RESPONDING",
    "POWERED_DOWN",
    "POWER_DOWN",
    "MAINT",
    "MAINTENANCE",
    "INVAL",
    "INVALID",
    "INVALID_REG",
)
DEFAULT_POLL_INTERVAL_SECONDS = 60
CATEGORIES = (
    "unavailable",
    "unallocated",
    "allocated_no_process",
    "allocated_idle",
    "active",
    "unmeasured",
)
CAPACITY_CATEGORIES = (
    "unavailable",
    "unallocated",
    "allocated_no_process",
    "allocated_idle",
    "unmeasured",
    "useful",
    "active_failed",
    "active_other",
)

_GAP = "make_interval(secs => CAST(:poll_seconds AS float8))"


def _in_clusters(column: str) -> str:
    return f"(cardinality(CAST(:f_clusters AS text[])) = 0 OR {column} = ANY(CAST(:f_clusters AS text[])))"


def _in_partitions(column: str) -> str:
    return (
        f"(cardinality(CAST(:f_partitions AS text[])) = 0 OR {column} = ANY(CAST(:f_partitions AS text[])))"
    )


def _fit(expr: str) -> str:
    """EXPR (a running total of a node-day's allocation) scaled onto the available time."""
    return f"(CASE WHEN fit_to IS NULL THEN ({expr}) ELSE round(({expr}) * fit_to / node_allocated, 9) END)"


def _parts_ctes() -> str:
    """CTEs ending in part_row: (day, cluster, partition, outcome) with the six categories and
    capacity_unknown, in GPU-seconds (numeric); `fitted` holds each node-day's fit."""
    return f"""
    days AS (
        SELECT CAST(d AS date) AS day,
               d AT TIME ZONE CAST(:tz AS text) AS lo,
               (d + interval '1 day') AT TIME ZONE CAST(:tz AS text) AS hi
        FROM generate_series(CAST(:first_day AS timestamp), CAST(:last_day AS timestamp), interval '1 day') AS d
    ),
    span AS (SELECT min(lo) AS lo, max(hi) AS hi FROM days),
    recent_state AS (
        SELECT n.* FROM node_state n CROSS JOIN span s
        WHERE n.last_seen_at >= s.lo - {_GAP} AND n.first_seen_at < s.hi
          AND {_in_clusters("n.cluster")}
    ),
    earlier_state AS (
        SELECT e.*
        FROM (SELECT DISTINCT cluster, node FROM recent_state) r CROSS JOIN span s
        CROSS JOIN LATERAL (
            SELECT * FROM node_state m
            WHERE m.cluster = r.cluster AND m.node = r.node AND m.last_seen_at < s.lo - {_GAP}
            ORDER BY m.last_seen_at DESC LIMIT 1
        ) e
    ),
    state_interval AS MATERIALIZED (
        -- the next row of a node is the next one here, except after the last one fetched
        SELECT r.cluster, r.node, r.gpus_total, coalesce(r.partitions[1], '') AS home_partition,
               r.states && CAST(:down_states AS text[]) AS down, r.first_seen_at AS since,
               least(coalesce(
                   lead(r.first_seen_at) OVER (PARTITION BY r.cluster, r.node ORDER BY r.last_seen_at),
                   (SELECT m.first_seen_at FROM node_state m
                    WHERE m.cluster = r.cluster AND m.node = r.node AND m.last_seen_at > r.last_seen_at
                    ORDER BY m.last_seen_at LIMIT 1),
                   r.last_seen_at + {_GAP}), CAST(:now AS timestamptz)) AS until
        FROM (SELECT * FROM recent_state UNION ALL SELECT * FROM earlier_state) r
    ),
    node_day AS (
        SELECT i.cluster, i.node, CAST(t.day AS date) AS day,
               sum(i.gpus_total * extract(epoch FROM least(i.until, t.hi) - greatest(i.since, t.lo)))
                   AS capacity,
               coalesce(sum(i.gpus_total * extract(epoch FROM least(i.until, t.hi) - greatest(i.since, t.lo)))
                   FILTER (WHERE i.down), 0) AS unavailable,
               (array_agg(i.home_partition ORDER BY i.since DESC))[1] AS home_partition
        FROM state_interval i
        CROSS JOIN LATERAL generate_series(
            date_trunc('day', i.since AT TIME ZONE CAST(:tz AS text)),
            date_trunc('day', (i.until - interval '1 microsecond') AT TIME ZONE CAST(:tz AS text)),
            interval '1 day') AS local_day
        CROSS JOIN LATERAL (
            SELECT local_day AS day, local_day AT TIME ZONE CAST(:tz AS text) AS lo,
                   (local_day + interval '1 day') AT TIME ZONE CAST(:tz AS text) AS hi
        ) t
        WHERE i.until > i.since
          AND CAST(t.day AS date) >= CAST(:first_day AS date) AND CAST(t.day AS date) <= CAST(:last_day AS date)
        GROUP BY i.cluster, i.node, CAST(t.day AS date)
    ),
    alloc_row AS (
        -- summed in float8 (the rollup's own type), then numeric: from here on every figure
        -- is exact, so the parts of a row add up to its installed time to the last digit.
        -- node_day_allocation holds gpu_attribution's parts summed per node-day and the
        -- attempt's partition and state (migration 0013: kept by triggers, never behind)
        SELECT g.cluster, g.node, g.day, g.partition, coalesce(o.outcome, 'unknown') AS outcome,
               CAST(sum(g.no_process_seconds) AS numeric) AS no_process,
               CAST(sum(g.idle_with_process_seconds) AS numeric) AS idle,
               CAST(sum(g.active_seconds) AS numeric) AS active,
               CAST(sum(g.unmeasured_seconds) AS numeric) AS unmeasured
        FROM node_day_allocation g
        LEFT JOIN outcome_class o ON o.state = g.state
        WHERE g.day >= CAST(:first_day AS date) AND g.day <= CAST(:last_day AS date)
          AND {_in_clusters("g.cluster")}
        GROUP BY g.cluster, g.node, g.day, g.partition, coalesce(o.outcome, 'unknown')
    ),
    ordered AS (
        SELECT a.*, a.no_process + a.idle + a.unmeasured + a.active AS allocated,
               coalesce(sum(a.no_process + a.idle + a.unmeasured + a.active) OVER (
                   PARTITION BY a.cluster, a.node, a.day ORDER BY a.partition, a.outcome
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before,
               sum(a.no_process + a.idle + a.unmeasured + a.active) OVER (
                   PARTITION BY a.cluster, a.node, a.day) AS node_allocated
        FROM alloc_row a
    ),
    fitted AS (
        SELECT o.*, n.capacity IS NULL AS no_state,
               CASE WHEN n.capacity IS NOT NULL AND o.node_allocated > n.capacity - n.unavailable
                    THEN n.capacity - n.unavailable END AS fit_to
        FROM ordered o LEFT JOIN node_day n USING (cluster, node, day)
    ),
    scaled AS (
        SELECT cluster, node, day, partition, outcome, no_state,
               {_fit("before + no_process")} - {_fit("before")} AS no_process,
               {_fit("before + no_process + idle")} - {_fit("before + no_process")} AS idle,
               {_fit("before + no_process + idle + unmeasured")}
                   - {_fit("before + no_process + idle")} AS unmeasured,
               {_fit("before + allocated")} - {_fit("before + no_process + idle + unmeasured")} AS active
        FROM fitted
    ),
    node_fitted AS (
        SELECT cluster, node, day, sum(no_process + idle + unmeasured + active) AS allocated
        FROM scaled GROUP BY cluster, node, day
    ),
    part_row AS (
        SELECT day, cluster, partition, outcome,
               CAST(0 AS numeric) AS unavailable, CAST(0 AS numeric) AS unallocated,
               no_process, idle, active, unmeasured,
               CASE WHEN no_state THEN no_process + idle + active + unmeasured ELSE 0 END AS capacity_unknown
        FROM scaled
        UNION ALL
        SELECT n.day, n.cluster, n.home_partition, NULL,
               n.unavailable, n.capacity - n.unavailable - coalesce(x.allocated, 0),
               0, 0, 0, 0, 0
        FROM node_day n LEFT JOIN node_fitted x USING (cluster, node, day)
    )
    """


def _bind(
    *,
    first_day: date,
    last_day: date,
    now: datetime,
    timezone: str,
    poll_interval_seconds: float,
    scope: Scope,
    job_filter: JobFilter | None,
    **extra: Any,
) -> dict[str, Any]:
    return params(
        scope,
        job_filter,
        first_day=first_day,
        last_day=last_day,
        now=now,
        tz=timezone,
        poll_seconds=float(poll_interval_seconds),
        down_states=list(DOWN_STATES),
        **extra,
    )


def _check(job_filter: JobFilter | None, first_day: date, last_day: date) -> None:
    if last_day < first_day:
        raise ValueError("the window is empty: -E must be after -S")
    if job_filter is not None and (job_filter.accounts or job_filter.users):
        raise ValueError("GPU capacity is per cluster and partition: -A/-u do not apply")


def taxonomy_report(
    conn: Connection,
    *,
    first_day: date,
    last_day: date,
    now: datetime,
    timezone: str,
    scope: Scope,
    job_filter: JobFilter | None = None,
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
) -> list[dict[str, Any]]:
    """One row per (day, cluster, partition): installed GPU-hours and their six parts.

    Rows carry GPU-seconds (`<part>_gpu_seconds`, Decimal) rounded to milliseconds so that the
    rounded parts add up to the rounded installed exactly.
    Capacity is not anybody's own data: a scope short of everything gets no rows.
    """
    _check(job_filter, first_day, last_day)
    if not scope.everything:
        return []
    sql = f"""
        WITH {_parts_ctes()}
        SELECT day, cluster, partition,
               sum(unavailable) AS unavailable, sum(unallocated) AS unallocated,
               sum(no_process) AS allocated_no_process, sum(idle) AS allocated_idle,
               sum(active) AS active, sum(unmeasured) AS unmeasured,
               sum(capacity_unknown) AS capacity_unknown
        FROM part_row
        WHERE {_in_partitions("partition")}
        GROUP BY day, cluster, partition
        ORDER BY day, cluster, partition
    """
    bind = _bind(
        first_day=first_day,
        last_day=last_day,
        now=now,
        timezone=timezone,
        poll_interval_seconds=poll_interval_seconds,
        scope=scope,
        job_filter=job_filter,
    )
    rows = []
    no_jit(conn)
    for r in conn.execute(text(sql), bind).mappings():
        seconds = {c: Decimal(r[c]) for c in CATEGORIES}
        installed = sum(seconds.values(), Decimal(0))
        installed_seconds, part_seconds = apportion_seconds(list(seconds.values()))
        row: dict[str, Any] = {"day": r["day"], "cluster": r["cluster"], "partition": r["partition"]}
        row["installed_gpu_seconds"] = installed_seconds
        row.update({f"{c}_gpu_seconds": p for c, p in zip(CATEGORIES, part_seconds, strict=True)})
        row.update({f"{c}_share": _share(seconds[c], installed) for c in CATEGORIES})
        row["capacity_unknown_gpu_seconds"] = apportion_seconds([Decimal(r["capacity_unknown"])])[0]
        rows.append(row)
    return rows


def capacity_report(
    conn: Connection,
    *,
    first_day: date,
    last_day: date,
    now: datetime,
    timezone: str,
    scope: Scope,
    job_filter: JobFilter | None = None,
    target_gpu_hours: float | None = None,
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
    resubmission_window_seconds: int = DEFAULT_RESUBMISSION_WINDOW_SECONDS,
) -> dict[str, list[dict[str, Any]]]:
    """Sections `summary` (per cluster: useful share, useful work per GPU-month, GPUs
    installed now, required GPUs for TARGET_GPU_HOURS useful GPU-hours a month) and
    `breakdown` (per cluster and category: GPU-hours and share of installed, additive)."""
    _check(job_filter, first_day, last_day)
    sections: dict[str, list[dict[str, Any]]] = {"summary": [], "breakdown": []}
    if not scope.everything:
        return sections
    zone = ZoneInfo(timezone)
    window_start = datetime.combine(first_day, time(), zone).astimezone(UTC)
    window_end = datetime.combine(last_day + timedelta(days=1), time(), zone).astimezone(UTC)
    bind = _bind(
        first_day=first_day,
        last_day=last_day,
        now=now,
        timezone=timezone,
        poll_interval_seconds=poll_interval_seconds,
        scope=scope,
        job_filter=job_filter,
        start=window_start,
        end=window_end,
        resubmission_seconds=resubmission_window_seconds,
    )
    installed_now = gpus_installed_now(
        conn, job_filter=job_filter, poll_interval_seconds=poll_interval_seconds
    )
    no_jit(conn)
    ctes = retry_ctes(conn, bind)
    sql = f"""
        WITH {ctes},
        {_parts_ctes()},
        retry_node_day AS (
            -- retry attempts' GPU-seconds, fitted like the rest of their node-day
            SELECT g.cluster, g.node, g.day, sum(g.allocated_seconds) AS seconds
            FROM w JOIN attempt_node_day g USING (cluster, job_id_raw, submit_at)
            WHERE w.is_retry AND g.day >= CAST(:first_day AS date) AND g.day <= CAST(:last_day AS date)
            GROUP BY g.cluster, g.node, g.day
        ),
        retry AS (
            SELECT x.cluster,
                   sum(CAST(x.seconds AS numeric) * coalesce(f.fit_to / nullif(f.node_allocated, 0), 1)) AS seconds
            FROM retry_node_day x
            LEFT JOIN (SELECT DISTINCT cluster, node, day, fit_to, node_allocated FROM fitted) f
              USING (cluster, node, day)
            GROUP BY x.cluster
        )
        SELECT cluster,
               sum(unavailable) AS unavailable, sum(unallocated) AS unallocated,
               sum(no_process) AS allocated_no_process, sum(idle) AS allocated_idle,
               sum(unmeasured) AS unmeasured,
               coalesce(sum(active) FILTER (WHERE outcome = 'completed'), 0) AS useful,
               coalesce(sum(active) FILTER (WHERE slurmtel_failed(outcome)), 0) AS active_failed,
               coalesce(sum(active) FILTER (WHERE outcome IS NOT NULL AND outcome <> 'completed'
                                           AND NOT slurmtel_failed(outcome)), 0) AS active_other,
               coalesce(sum(no_process + idle + active + unmeasured)
                   FILTER (WHERE slurmtel_failed(outcome)), 0) AS failed,
               sum(capacity_unknown) AS capacity_unknown,
               coalesce((SELECT r.seconds FROM retry r WHERE r.cluster = part_row.cluster), 0) AS retry
        FROM part_row
        WHERE {_in_partitions("partition")}
        GROUP BY cluster ORDER BY cluster
    """
    window_seconds = exact_seconds(min(window_end, max(now, window_start)) - window_start)
    months = months_in(window_start, min(window_end, max(now, window_start)), zone)
    for r in conn.execute(text(sql), bind).mappings():
        seconds = {c: Decimal(r[c]) for c in CAPACITY_CATEGORIES}
        installed = sum(seconds.values(), Decimal(0))
        installed_seconds, part_seconds = apportion_seconds(list(seconds.values()))
        for category, part in zip(CAPACITY_CATEGORIES, part_seconds, strict=True):
            sections["breakdown"].append(
                {
                    "cluster": r["cluster"],
                    "category": category,
                    "category_gpu_seconds": part,
                    "category_share": _share(seconds[category], installed),
                }
            )
        per_month = per_gpu_month(seconds["useful"], installed, window_seconds, months)
        target = Decimal(str(target_gpu_hours)) * 3600 if target_gpu_hours is not None else None
        required = float(target / per_month) if target is not None and per_month else None
        now_total, now_available = installed_now.get(r["cluster"], (0, 0))
        sections["summary"].append(
            {
                "cluster": r["cluster"],
                "first_day": first_day,
                "last_day": last_day,
                "installed_gpu_seconds": installed_seconds,
                "average_gpus_installed": round(float(installed / window_seconds), 2)
                if window_seconds > 0
                else None,
                "useful_gpu_seconds": part_seconds[CAPACITY_CATEGORIES.index("useful")],
                "useful_share": _share(seconds["useful"], installed),
                "failed_gpu_seconds": apportion_seconds([Decimal(r["failed"])])[0],
                "retry_gpu_seconds": apportion_seconds([Decimal(r["retry"])])[0],
                "retry_share": _share(Decimal(r["retry"]), installed),
                "capacity_unknown_gpu_seconds": apportion_seconds([Decimal(r["capacity_unknown"])])[0],
                "useful_gpu_seconds_per_gpu_month": round(per_month, 3) if per_month is not None else None,
                "gpus_installed_now": now_total,
                "gpus_available_now": now_available,
                "target_gpu_seconds_per_month": target,
                "required_gpus": round(required, 2) if required is not None else None,
                "additional_gpus_needed": max(0, math.ceil(round(required, 6)) - now_total)
                if required is not None
                else None,
            }
        )
    return sections


def gpus_installed_now(
    conn: Connection,
    *,
    job_filter: JobFilter | None = None,
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
) -> dict[str, tuple[int, int]]:
    """cluster -> (GPUs, GPUs not in a DOWN_STATES state) of the nodes seen in the cluster's
    latest controller poll (within one poll interval of its newest node_state row)."""
    sql = f"""
        WITH latest AS (
            SELECT cluster, max(last_seen_at) AS at FROM node_state
            WHERE {_in_clusters("cluster")} GROUP BY cluster
        ),
        node_now AS (
            SELECT DISTINCT ON (n.cluster, n.node) n.cluster, n.node, n.gpus_total, n.partitions,
                   n.states && CAST(:down_states AS text[]) AS down
            FROM node_state n JOIN latest l USING (cluster)
            WHERE n.last_seen_at >= l.at - {_GAP}
            ORDER BY n.cluster, n.node, n.last_seen_at DESC
        )
        SELECT cluster, sum(gpus_total) AS total, coalesce(sum(gpus_total) FILTER (WHERE NOT down), 0) AS up
        FROM node_now
        WHERE cardinality(CAST(:f_partitions AS text[])) = 0 OR partitions && CAST(:f_partitions AS text[])
        GROUP BY cluster
    """
    bind = {
        **(job_filter or JobFilter()).sql_params(),
        "poll_seconds": float(poll_interval_seconds),
        "down_states": list(DOWN_STATES),
    }
    return {r.cluster: (int(r.total), int(r.up)) for r in conn.execute(text(sql), bind)}


def _share(part: Decimal, whole: Decimal) -> float | None:
    if not whole:
        return None
    return round(float(part / whole), 4)
