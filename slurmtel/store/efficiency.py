"""What `seff` and `jobstats` tell about an attempt's host side: CPU efficiency, peak memory
against the memory requested, time used against the time limit.

From the per-attempt step usage the sacct source keeps (job_attempt.cpu_time_seconds,
mem_peak_task_bytes, mem_peak_step_bytes, usage_steps: sacct without -X) and the allocation:

- cpu_efficiency_percent = TotalCPU / (allocated CPUs x elapsed), as seff computes it;
- mem_peak_bytes = the largest step's peak over all its tasks (TRESUsageInTot mem), against
  mem_requested_bytes = AllocTRES mem (the whole allocation, all nodes), as jobstats does;
  mem_peak_task_bytes is the largest single task's (MaxRSS, what seff shows);
- time_limit_used_percent = elapsed / time limit.

A figure is None when it cannot be known (no steps read: sacct -X; no time limit; a running
attempt's usage is partial until its steps end). For the researcher view (`slurmtel job`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slurmtel.access import Scope
from slurmtel.store.sql import Connection, text

MIB = 1024 * 1024


@dataclass(frozen=True)
class AttemptEfficiency:
    cluster: str
    job_id_raw: int
    submit_at: datetime
    job_id: str
    state: str
    alloc_cpus: int
    elapsed_seconds: float | None
    cpu_time_seconds: float | None
    cpu_efficiency_percent: float | None
    mem_requested_bytes: int | None
    mem_peak_bytes: int | None
    mem_peak_task_bytes: int | None
    mem_efficiency_percent: float | None
    time_limit_seconds: int | None
    time_limit_used_percent: float | None
    # steps the usage comes from (None: none read)
    usage_steps: int | None


# the columns efficiency_from_row reads, from job_attempt (or job_attempt_outcome) aliased a;
# :now is the end of a running attempt
_COLUMNS = """
    a.cluster, a.job_id_raw, a.submit_at, a.job_id, a.state, a.alloc_cpus, a.time_limit_seconds,
    a.cpu_time_seconds, a.mem_peak_task_bytes, a.mem_peak_step_bytes, a.usage_steps,
    (a.alloc_tres->>'mem')::bigint AS mem_mb,
    slurmtel_elapsed_seconds(a.start_at, a.end_at, :now) AS elapsed
"""


def attempt_efficiency(
    conn: Connection, *, cluster: str, job_id_raw: int, job_submit_at: datetime, scope: Scope, now: datetime
) -> list[AttemptEfficiency]:
    """The attempts of one job (cluster, job_id_raw, job_submit_at: its first attempt's submit
    time), in order; none outside SCOPE."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_COLUMNS}
            FROM job_attempt a
            WHERE cluster = :cluster AND job_id_raw = :raw
              AND coalesce(job_submit_at, submit_at) = :job_submit_at
              AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
            ORDER BY submit_at
            """
        ),
        {
            "cluster": cluster,
            "raw": job_id_raw,
            "job_submit_at": job_submit_at,
            "now": now,
            **scope.sql_params(),
        },
    ).mappings()
    return [efficiency_from_row(r) for r in rows]


def efficiency_from_row(r: Mapping[Any, Any]) -> AttemptEfficiency:
    """One attempt's figures from a row with _COLUMNS (slurmtel.store.jobview.user_attempts
    selects the same names)."""
    elapsed = float(r["elapsed"]) if r["elapsed"] is not None else None
    requested = int(r["mem_mb"]) * MIB if r["mem_mb"] else None
    cpu = r["cpu_time_seconds"]
    alloc_cpus = int(r["alloc_cpus"] or 0)
    return AttemptEfficiency(
        cluster=r["cluster"],
        job_id_raw=int(r["job_id_raw"]),
        submit_at=r["submit_at"],
        job_id=r["job_id"],
        state=r["state"],
        alloc_cpus=alloc_cpus,
        elapsed_seconds=elapsed,
        cpu_time_seconds=cpu,
        cpu_efficiency_percent=_percent(cpu, alloc_cpus * elapsed if elapsed else None),
        mem_requested_bytes=requested,
        mem_peak_bytes=r["mem_peak_step_bytes"],
        mem_peak_task_bytes=r["mem_peak_task_bytes"],
        mem_efficiency_percent=_percent(r["mem_peak_step_bytes"], requested),
        time_limit_seconds=r["time_limit_seconds"],
        time_limit_used_percent=_percent(elapsed, r["time_limit_seconds"]),
        usage_steps=r["usage_steps"],
    )


def attempts_efficiency(
    conn: Connection, keys: Sequence[tuple[str, int, datetime]], *, now: datetime
) -> dict[tuple[str, int, datetime], AttemptEfficiency]:
    """The figures of the attempts KEYS (cluster, job_id_raw, submit_at), found in scope before."""
    if not keys:
        return {}
    rows = conn.execute(
        text(
            f"""
            SELECT {_COLUMNS}
            FROM job_attempt a
            JOIN unnest(CAST(:clusters AS text[]), CAST(:jobs AS bigint[]), CAST(:submits AS timestamptz[]))
                AS k(cluster, job_id_raw, submit_at)
              ON k.cluster = a.cluster AND k.job_id_raw = a.job_id_raw AND k.submit_at = a.submit_at
            """
        ),
        {
            "clusters": [k[0] for k in keys],
            "jobs": [k[1] for k in keys],
            "submits": [k[2] for k in keys],
            "now": now,
        },
    ).mappings()
    figures = (efficiency_from_row(r) for r in rows)
    return {(e.cluster, e.job_id_raw, e.submit_at): e for e in figures}


def _percent(part: float | int | None, whole: float | int | None) -> float | None:
    if part is None or not whole:
        return None
    return round(100.0 * float(part) / float(whole), 2)
