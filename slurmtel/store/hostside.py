"""The host side of jobs and GPUs (issue 26): writes of the agent's job and GPU host windows and
of Lustre jobstats snapshots, and the reads the job view makes of them.

Every write is idempotent on its natural key (migration 0021): a window that arrives twice (a
re-pulled page, a restarted agent) is stored once, with the values it first had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.records import GpuHostWindow, JobHostWindow, LustreJobStat

_JOB_COLUMNS = (
    "node",
    "job_id",
    "window_start_at",
    "window_seconds",
    "cgroup_version",
    "read_bytes",
    "write_bytes",
    "read_ops",
    "write_ops",
    "cpu_usage_seconds",
    "cpus",
    "memory_peak_bytes",
    "io_some_stall_seconds",
    "io_full_stall_seconds",
    "cpu_some_stall_seconds",
    "memory_some_stall_seconds",
    "memory_full_stall_seconds",
)
_GPU_COLUMNS = (
    "node",
    "gpu_uuid",
    "window_start_at",
    "window_seconds",
    "pcie_tx_bytes",
    "pcie_rx_bytes",
    "throttle_power_seconds",
    "throttle_thermal_seconds",
    "throttle_hw_slowdown_seconds",
)
_LUSTRE_COLUMNS = (
    "target",
    "job_name",
    "snapshot_at",
    "job_id",
    "start_at",
    "read_bytes",
    "write_bytes",
    "read_ops",
    "write_ops",
    "metadata_ops",
    "read_wait_seconds",
    "write_wait_seconds",
)


def _insert(
    conn: Connection, table: str, columns: Sequence[str], key: str, rows: list[dict[str, Any]]
) -> int:
    if not rows:
        return 0
    names = ", ".join(columns)
    values = ", ".join(f":{c}" for c in columns)
    result = conn.execute(
        text(f"INSERT INTO {table} ({names}) VALUES ({values}) ON CONFLICT ({key}) DO NOTHING"), rows
    )
    return int(result.rowcount or 0)


def write_job_host_windows(conn: Connection, windows: Iterable[JobHostWindow]) -> int:
    rows = {(w.node, w.job_id, w.window_start_at): {c: getattr(w, c) for c in _JOB_COLUMNS} for w in windows}
    return _insert(
        conn, "job_host_window", _JOB_COLUMNS, "node, job_id, window_start_at", list(rows.values())
    )


def write_gpu_host_windows(conn: Connection, windows: Iterable[GpuHostWindow]) -> int:
    rows = {(w.gpu_uuid, w.window_start_at): {c: getattr(w, c) for c in _GPU_COLUMNS} for w in windows}
    return _insert(conn, "gpu_host_window", _GPU_COLUMNS, "gpu_uuid, window_start_at", list(rows.values()))


def write_lustre_stats(conn: Connection, stats: Iterable[LustreJobStat]) -> int:
    rows = {(s.target, s.job_name, s.snapshot_at): {c: getattr(s, c) for c in _LUSTRE_COLUMNS} for s in stats}
    return _insert(
        conn, "lustre_job_stat", _LUSTRE_COLUMNS, "target, job_name, snapshot_at", list(rows.values())
    )


@dataclass(frozen=True)
class LustreJobTotals:
    """A job's Lustre traffic between two times: the increases of its entries' counters, all
    targets, reset and recreated entries counted from zero (slurmtel.parsers.lustre)."""

    read_bytes: int | None
    write_bytes: int | None
    metadata_ops: int | None
    targets: int


def lustre_job_totals(
    conn: Connection, *, job_id: str, start_at: datetime, end_at: datetime
) -> LustreJobTotals:
    """Increases of JOB_ID's entries from the last snapshot before START_AT (or the entry's
    first) to the last one by END_AT: a job id reused by another job later or earlier is not
    counted (its snapshots lie outside the attempt)."""
    row = conn.execute(
        text(
            """
            WITH s AS (
                SELECT target, job_name, snapshot_at, start_at, read_bytes, write_bytes, metadata_ops,
                       lag(read_bytes) OVER w AS prev_read, lag(write_bytes) OVER w AS prev_write,
                       lag(metadata_ops) OVER w AS prev_meta, lag(start_at) OVER w AS prev_start
                FROM lustre_job_stat
                WHERE job_id = :job AND snapshot_at > :lo - interval '1 hour' AND snapshot_at <= :hi
                WINDOW w AS (PARTITION BY target, job_name ORDER BY snapshot_at)
            ),
            inc AS (
                SELECT target,
                       CASE WHEN prev_read IS NULL OR read_bytes < prev_read
                                 OR start_at IS DISTINCT FROM prev_start THEN read_bytes
                            ELSE read_bytes - prev_read END AS read_inc,
                       CASE WHEN prev_write IS NULL OR write_bytes < prev_write
                                 OR start_at IS DISTINCT FROM prev_start THEN write_bytes
                            ELSE write_bytes - prev_write END AS write_inc,
                       CASE WHEN prev_meta IS NULL OR metadata_ops < prev_meta
                                 OR start_at IS DISTINCT FROM prev_start THEN metadata_ops
                            ELSE metadata_ops - prev_meta END AS meta_inc
                FROM s WHERE snapshot_at > :lo
            )
            SELECT sum(read_inc), sum(write_inc), sum(meta_inc), count(DISTINCT target) FROM inc
            """
        ),
        {"job": job_id, "lo": start_at, "hi": end_at},
    ).one()
    return LustreJobTotals(
        int(row[0]) if row[0] is not None else None,
        int(row[1]) if row[1] is not None else None,
        int(row[2]) if row[2] is not None else None,
        int(row[3] or 0),
    )
