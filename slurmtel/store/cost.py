"""The measured inputs of `slurmtel report cost` (docs/reports.md "report cost"), over whole site days.

Two kinds of rows, in exact GPU-seconds (PostgreSQL numeric, Decimal here):

- `partition` rows per (cluster, partition): the GPU-hour taxonomy's parts (the same CTEs and
  rules as `report taxonomy` / `report capacity`, see slurmtel.store.reports_taxonomy), split
  by outcome where it matters: installed = unavailable + unallocated + allocated_no_process +
  allocated_idle + active + unmeasured; useful = active of attempts classed completed (the
  `useful` of `report capacity`); failed = everything allocated to user_failure /
  system_failure attempts.
- `attempt` rows per (cluster, partition, account): the same allocated parts per account, each
  node-day scaled by the taxonomy's fit (fit_to / node_allocated, 1 where nothing is scaled),
  and retry = allocated GPU-seconds of retry attempts (see reports_retries), fitted the same
  way as `report capacity` fits them.

completed_jobs: jobs whose last attempt (with GPUs) ended in [start, end) classed completed,
per (cluster, partition, account), the count `slurmtel chargeback --completed-jobs` makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import Connection, text

from slurmtel.access import EVERYTHING
from slurmtel.store.chargeback import completed_jobs_by
from slurmtel.store.reports_admin import no_jit
from slurmtel.store.reports_retries import DEFAULT_RESUBMISSION_WINDOW_SECONDS, retry_ctes
from slurmtel.store.reports_taxonomy import DEFAULT_POLL_INTERVAL_SECONDS, _bind, _parts_ctes


@dataclass(frozen=True)
class MeasuredRow:
    """GPU-seconds of one (cluster, partition[, account]); kind 'partition' or 'attempt'."""

    kind: str
    cluster: str
    partition: str
    account: str
    unavailable: Decimal
    unallocated: Decimal
    allocated_no_process: Decimal
    allocated_idle: Decimal
    active: Decimal
    unmeasured: Decimal
    useful: Decimal
    failed: Decimal
    retry: Decimal

    @property
    def allocated(self) -> Decimal:
        return self.allocated_no_process + self.allocated_idle + self.active + self.unmeasured

    @property
    def installed(self) -> Decimal:
        return self.unavailable + self.unallocated + self.allocated


def measured_rows(
    conn: Connection,
    *,
    first_day: date,
    last_day: date,
    start: datetime,
    end: datetime,
    now: datetime,
    timezone: str,
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS,
    resubmission_window_seconds: int = DEFAULT_RESUBMISSION_WINDOW_SECONDS,
) -> list[MeasuredRow]:
    """`partition` and `attempt` rows over the site days FIRST_DAY..LAST_DAY (START, END: their
    edges, for the retry links). Cluster-wide: no scope or filter applies."""
    if last_day < first_day:
        raise ValueError("the window is empty: -E must be after -S")
    bind = _bind(
        first_day=first_day,
        last_day=last_day,
        now=now,
        timezone=timezone,
        poll_interval_seconds=poll_interval_seconds,
        scope=EVERYTHING,
        job_filter=None,
        start=start,
        end=end,
        resubmission_seconds=resubmission_window_seconds,
    )
    no_jit(conn)
    ctes = retry_ctes(conn, bind)
    sql = f"""
        WITH {ctes},
        {_parts_ctes()},
        fit AS (
            SELECT DISTINCT cluster, node, day,
                   CASE WHEN fit_to IS NULL THEN CAST(1 AS numeric)
                        ELSE fit_to / nullif(node_allocated, 0) END AS k
            FROM fitted
        ),
        attempt_part AS (
            -- as alloc_row (taxonomy), per account and retry flag too
            SELECT g.cluster, g.node, g.day, a.partition, a.account, a.outcome,
                   coalesce(w.is_retry, false) AS is_retry,
                   CAST(sum(g.no_process_seconds * g.gpu_fraction) AS numeric) AS no_process,
                   CAST(sum(greatest(0, g.idle_seconds - g.no_process_seconds) * g.gpu_fraction) AS numeric)
                       AS idle,
                   CAST(sum(greatest(0, g.covered_seconds - greatest(g.idle_seconds, g.no_process_seconds))
                       * g.gpu_fraction) AS numeric) AS active,
                   CAST(sum(g.unmeasured_seconds * g.gpu_fraction) AS numeric) AS unmeasured,
                   CAST(sum(g.allocated_seconds * g.gpu_fraction) AS numeric) AS allocated_seconds
            FROM gpu_attribution g
            JOIN job_attempt_outcome a USING (cluster, job_id_raw, submit_at)
            LEFT JOIN (SELECT DISTINCT cluster, job_id_raw, submit_at, is_retry FROM w WHERE is_retry) w
              USING (cluster, job_id_raw, submit_at)
            WHERE g.day >= CAST(:first_day AS date) AND g.day <= CAST(:last_day AS date)
            GROUP BY g.cluster, g.node, g.day, a.partition, a.account, a.outcome, coalesce(w.is_retry, false)
        )
        SELECT 'partition' AS kind, cluster, partition, '' AS account,
               sum(unavailable) AS unavailable, sum(unallocated) AS unallocated,
               sum(no_process) AS allocated_no_process, sum(idle) AS allocated_idle,
               sum(active) AS active, sum(unmeasured) AS unmeasured,
               coalesce(sum(active) FILTER (WHERE outcome = 'completed'), 0) AS useful,
               coalesce(sum(no_process + idle + active + unmeasured) FILTER (WHERE slurmtel_failed(outcome)), 0)
                   AS failed,
               CAST(0 AS numeric) AS retry
        FROM part_row
        GROUP BY cluster, partition
        UNION ALL
        SELECT 'attempt', p.cluster, p.partition, p.account,
               0, 0,
               sum(p.no_process * coalesce(f.k, 1)), sum(p.idle * coalesce(f.k, 1)),
               sum(p.active * coalesce(f.k, 1)), sum(p.unmeasured * coalesce(f.k, 1)),
               coalesce(sum(p.active * coalesce(f.k, 1)) FILTER (WHERE p.outcome = 'completed'), 0),
               coalesce(sum((p.no_process + p.idle + p.active + p.unmeasured) * coalesce(f.k, 1))
                   FILTER (WHERE slurmtel_failed(p.outcome)), 0),
               coalesce(sum(p.allocated_seconds * coalesce(f.k, 1)) FILTER (WHERE p.is_retry), 0)
        FROM attempt_part p LEFT JOIN fit f USING (cluster, node, day)
        GROUP BY p.cluster, p.partition, p.account
        ORDER BY 1 DESC, 2, 3, 4
    """
    return [
        MeasuredRow(
            kind=r["kind"],
            cluster=r["cluster"],
            partition=r["partition"],
            account=r["account"],
            **{
                name: Decimal(r[name])
                for name in (
                    "unavailable",
                    "unallocated",
                    "allocated_no_process",
                    "allocated_idle",
                    "active",
                    "unmeasured",
                    "useful",
                    "failed",
                    "retry",
                )
            },
        )
        for r in conn.execute(text(sql), bind).mappings()
    ]


def completed_jobs(conn: Connection, *, start: datetime, end: datetime) -> dict[tuple[str, str, str], int]:
    """(cluster, partition, account) -> jobs whose last attempt held GPUs and ended in
    [START, END) classed completed (the count chargeback's cost per completed job uses)."""
    counts = completed_jobs_by(conn, ("cluster", "partition", "account"), start=start, end=end)
    return {(cluster, partition, account): n for (cluster, partition, account), n in counts.items()}


def gpu_energy(conn: Connection, *, first_day: date, last_day: date) -> dict[tuple[str, str, str], float]:
    """(cluster, partition, account) -> joules the GPUs allocated to its attempts drew over the
    site days FIRST_DAY..LAST_DAY (the attribution rollup's energy_joules: each GPU's counter
    delta inside the allocation); no entry where nothing was measured."""
    no_jit(conn)
    rows = conn.execute(
        text(
            """
            SELECT g.cluster, a.partition, a.account, sum(g.energy_joules) AS joules
            FROM gpu_attribution g
            JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
            WHERE g.day >= :first_day AND g.day <= :last_day AND g.energy_joules IS NOT NULL
            GROUP BY g.cluster, a.partition, a.account
            """
        ),
        {"first_day": first_day, "last_day": last_day},
    )
    return {(r.cluster, r.partition, r.account): float(r.joules) for r in rows}
