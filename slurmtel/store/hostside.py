"""The host side of jobs and GPUs (issue 26): writes of the agent's job and GPU host windows, of
its network file system windows and of Lustre jobstats snapshots, and the reads the job view makes of them.

Every write is idempotent on its natural key (migration 0021): a window that arrives twice (a
re-pulled page, a restarted agent) is stored once, with the values it first had.

Host data that changes an attempt's idle causes after its GPU windows were attributed (an agent
restarted, a spool replayed, a Lustre snapshot read late) records a host batch (migration
0025): the next attribution run recomputes the attempts it overlaps from its first window on,
as it does for late GPU windows. A write whose windows a GPU ingest batch of the same
transaction covers (COVERED: the agent's page, host and GPU windows of the same rounds) records
none: that batch marks the same attempts from as early already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby
from typing import TYPE_CHECKING, Any

from slurmtel.store.sql import Connection, text

if TYPE_CHECKING:
    # the windows written are only annotated here: `slurmtel job` reads checkpoint estimates
    # from this module without building the typed records
    from slurmtel.records import GpuHostWindow, JobHostWindow, LustreJobStat, NodeFsWindow

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
    "pcie_tx_bytes",
    "pcie_rx_bytes",
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


# node -> (first, last window start) of the GPU windows stored in the caller's transaction
Covered = Mapping[str, tuple[datetime, datetime]]


def _record_host_batches(
    conn: Connection,
    source: str,
    rows: Sequence[dict[str, Any]],
    *,
    by_job: bool,
    covered: Covered | None,
) -> int:
    """A host batch per node (and job, BY_JOB) of ROWS' windows that COVERED does not cover."""
    spans: dict[tuple[str, str | None], tuple[datetime, datetime]] = {}
    for r in rows:
        start, end = (
            r["window_start_at"],
            r["window_start_at"] + timedelta(seconds=float(r["window_seconds"])),
        )
        gpu = (covered or {}).get(r["node"])
        if gpu is not None and gpu[0] <= start <= gpu[1]:
            continue
        key = (r["node"], r["job_id"] if by_job else None)
        lo, hi = spans.get(key, (start, end))
        spans[key] = (min(lo, start), max(hi, end))
    return _insert_host_batches(conn, source, [(n, j, lo, hi) for (n, j), (lo, hi) in spans.items()])


def _insert_host_batches(
    conn: Connection, source: str, spans: Sequence[tuple[str, str | None, datetime, datetime]]
) -> int:
    if not spans:
        return 0
    conn.execute(
        text(
            "INSERT INTO host_batch (source, node, job_id, window_min_at, window_max_at) "
            "VALUES (:source, :node, :job, :lo, :hi)"
        ),
        [{"source": source, "node": n, "job": j, "lo": lo, "hi": hi} for n, j, lo, hi in spans],
    )
    return len(spans)


def write_job_host_windows(
    conn: Connection, windows: Iterable[JobHostWindow], *, covered: Covered | None = None
) -> int:
    rows = {(w.node, w.job_id, w.window_start_at): {c: getattr(w, c) for c in _JOB_COLUMNS} for w in windows}
    written = _insert(
        conn, "job_host_window", _JOB_COLUMNS, "node, job_id, window_start_at", list(rows.values())
    )
    if written:
        _record_host_batches(conn, "job_host", list(rows.values()), by_job=True, covered=covered)
    return written


def write_gpu_host_windows(
    conn: Connection, windows: Iterable[GpuHostWindow], *, covered: Covered | None = None
) -> int:
    """The windows in which the GPU was throttled (power, thermal, HW slowdown): a row per
    GPU-window would cost ~160 bytes each, four times a packed window (benchmarks/window_storage.py);
    an unthrottled window is the absence of a row, its PCIe bytes are in its job's window."""
    rows = {
        (w.gpu_uuid, w.window_start_at): {c: getattr(w, c) for c in _GPU_COLUMNS}
        for w in windows
        if w.throttled
    }
    written = _insert(conn, "gpu_host_window", _GPU_COLUMNS, "gpu_uuid, window_start_at", list(rows.values()))
    if written:
        _record_host_batches(conn, "gpu_host", list(rows.values()), by_job=False, covered=covered)
    return written


_FS_COLUMNS = (
    "node",
    "filesystem",
    "window_start_at",
    "fstype",
    "device",
    "window_seconds",
    "read_bytes",
    "write_bytes",
    "read_ops",
    "write_ops",
    "read_rtt_seconds",
    "write_rtt_seconds",
)


def write_node_fs_windows(
    conn: Connection, windows: Iterable[NodeFsWindow], *, covered: Covered | None = None
) -> int:
    rows = {
        (w.node, w.window_start_at, w.filesystem): {c: getattr(w, c) for c in _FS_COLUMNS} for w in windows
    }
    written = _insert(
        conn, "node_fs_window", _FS_COLUMNS, "node, window_start_at, filesystem", list(rows.values())
    )
    if written:
        _record_host_batches(conn, "node_fs", list(rows.values()), by_job=False, covered=covered)
    return written


def write_lustre_stats(conn: Connection, stats: Iterable[LustreJobStat]) -> int:
    """Lustre jobstats snapshots; a host batch per Slurm job whose counters moved: its traffic
    is spread over the interval since the entry's previous snapshot (or its start_at), the
    windows in which the attribution run finds it change."""
    rows = {(s.target, s.job_name, s.snapshot_at): {c: getattr(s, c) for c in _LUSTRE_COLUMNS} for s in stats}
    written = _insert(
        conn, "lustre_job_stat", _LUSTRE_COLUMNS, "target, job_name, snapshot_at", list(rows.values())
    )
    keys = [k for k, r in rows.items() if r["job_id"]]
    if written and keys:
        conn.execute(
            text(
                """
                INSERT INTO host_batch (source, node, job_id, window_min_at, window_max_at)
                SELECT 'lustre', '', s.job_id, min(coalesce(p.snapshot_at, s.start_at, s.snapshot_at)),
                       max(s.snapshot_at)
                FROM unnest(CAST(:targets AS text[]), CAST(:names AS text[]), CAST(:ats AS timestamptz[]))
                     AS k(target, job_name, snapshot_at)
                JOIN lustre_job_stat s USING (target, job_name, snapshot_at)
                LEFT JOIN LATERAL (
                    SELECT q.snapshot_at, q.start_at, q.read_bytes, q.write_bytes FROM lustre_job_stat q
                    WHERE q.target = s.target AND q.job_name = s.job_name AND q.snapshot_at < s.snapshot_at
                    ORDER BY q.snapshot_at DESC LIMIT 1
                ) p ON true
                -- an entry whose counters did not move changes no window
                WHERE p.snapshot_at IS NULL OR s.start_at IS DISTINCT FROM p.start_at
                   OR s.read_bytes IS DISTINCT FROM p.read_bytes OR s.write_bytes IS DISTINCT FROM p.write_bytes
                GROUP BY s.job_id
                """
            ),
            {
                "targets": [k[0] for k in keys],
                "names": [k[1] for k in keys],
                "ats": [k[2] for k in keys],
            },
        )
    return written


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


# ---------------------------------------------------------------- checkpoints and start-up


# start-up is looked for in the attempt's first hour: GPUs not active by then are reported as
# not started up (None), and the attribution run reads no more of an ended attempt's windows
# than that hour and its write bursts
STARTUP_HORIZON = timedelta(hours=1)


@dataclass(frozen=True)
class CheckpointThresholds:
    """config.idle_causes' checkpoint and start-up keys."""

    write_bytes: int = 1_000_000_000
    dip_percent: float = 20.0
    merge_windows: int = 2
    startup_active_percent: float = 20.0


@dataclass(frozen=True)
class CheckpointEstimate:
    episodes: int
    checkpoint_gpu_seconds: float
    checkpoint_write_bytes: int
    # None when the GPUs never became active (or no GPU window is known)
    startup_seconds: float | None
    startup_gpu_seconds: float | None
    startup_read_bytes: int | None


def checkpoint_estimate(
    conn: Connection,
    *,
    cluster: str,
    job_id_raw: int,
    submit_at: datetime,
    nodes: Sequence[str],
    start_at: datetime,
    end_at: datetime,
    gpus: float,
    thresholds: CheckpointThresholds,
    window_seconds: int = 30,
) -> CheckpointEstimate | None:
    """The attempt's checkpoint episodes and start-up (docs/idle-causes.md), from its cgroup
    windows on its nodes and the windows of the GPUs attribution mapped it to; None when it
    has no cgroup window at all (not measured).

    Of the GPUs' windows (overlapping [START_AT, END_AT)) only those the estimate can use are
    read, as refresh_checkpoints reads them: none without a cgroup window; those starting in
    the start-up hour; after it, those starting with a cgroup window that wrote
    THRESHOLDS.write_bytes (a window elsewhere is neither start-up nor a checkpoint). Reading
    every window of a long job was most of `slurmtel job`'s SQL (issue 28)."""
    rows = conn.execute(
        text(
            """
            WITH uuids AS (
                SELECT array_agg(DISTINCT gpu_uuid) AS uuids FROM gpu_attribution
                WHERE cluster = :cluster AND job_id_raw = :raw AND submit_at = :submit AND gpu_uuid <> ''
            ),
            host AS MATERIALIZED (
                SELECT window_start_at, sum(write_bytes) AS written, sum(read_bytes) AS read
                FROM job_host_window
                WHERE job_id = CAST(:raw AS text) AND node = ANY (:nodes)
                  AND window_start_at >= :lo - interval '1 minute' AND window_start_at < :hi
                GROUP BY window_start_at
            ),
            -- the start-up hour whole, and each later write burst's own start (no window is in both)
            reads AS (
                SELECT least(CAST(:hi AS timestamptz), CAST(:lo AS timestamptz) + interval '1 hour') AS hi,
                       NULL::timestamptz AS at
                WHERE EXISTS (SELECT 1 FROM host)
                UNION ALL
                SELECT h.window_start_at + interval '30 seconds', h.window_start_at FROM host h
                WHERE h.written >= :write_bytes AND h.window_start_at >= CAST(:lo AS timestamptz) + interval '1 hour'
            ),
            gpu AS (
                SELECT w.window_start_at, avg(w.util_mean_percent) AS util,
                       sum(least(w.idle_seconds, w.covered_seconds)) AS idle
                FROM uuids u CROSS JOIN reads r
                CROSS JOIN LATERAL slurmtel_gpu_windows(u.uuids, coalesce(r.at, :lo), r.hi) w
                WHERE u.uuids IS NOT NULL AND w.window_start_at >= :lo - interval '1 minute'
                  AND (r.at IS NULL OR w.window_start_at = r.at)
                GROUP BY w.window_start_at
            )
            SELECT coalesce(h.window_start_at, g.window_start_at) AS at, h.written, h.read, g.util, g.idle,
                   h.window_start_at IS NOT NULL AS measured
            FROM host h FULL JOIN gpu g USING (window_start_at)
            ORDER BY 1
            """
        ),
        {
            "cluster": cluster,
            "raw": job_id_raw,
            "submit": submit_at,
            "nodes": list(nodes),
            "lo": start_at,
            "hi": end_at,
            "write_bytes": thresholds.write_bytes,
        },
    ).all()
    return estimate_from_windows(rows, start_at, gpus, thresholds, window_seconds)


def estimate_from_windows(
    rows: Sequence[Any],
    start_at: datetime,
    gpus: float,
    thresholds: CheckpointThresholds,
    window_seconds: int = 30,
) -> CheckpointEstimate | None:
    """The estimate from an attempt's windows in time order, each with `at`, `written`,
    `read` (its cgroup windows summed over its nodes), `util`, `idle` (its GPUs' mean
    utilisation and idle seconds) and `measured` (a cgroup window exists); pure."""
    if not any(r.measured for r in rows):
        return None
    episodes, gpu_seconds, written = 0, 0.0, 0
    last_index: int | None = None
    startup: float | None = None
    read_before = 0
    window = timedelta(seconds=window_seconds)
    for r in rows:
        index = int(r.at.timestamp())
        # a window that ended by the start is the GPUs' previous job's (read for the window
        # the start falls in, which may begin before it)
        if startup is None and start_at < r.at + window and r.at < start_at + STARTUP_HORIZON:
            if r.util is not None and float(r.util) >= thresholds.startup_active_percent:
                startup = max(0.0, (r.at - start_at).total_seconds())
            else:
                read_before += int(r.read or 0)
        dip = r.util is not None and float(r.util) < thresholds.dip_percent
        if dip and r.written is not None and r.written >= thresholds.write_bytes:
            step = index // window_seconds
            if last_index is None or step - last_index > thresholds.merge_windows:
                episodes += 1
            last_index = step
            gpu_seconds += float(r.idle or 0)
            written += int(r.written)
    return CheckpointEstimate(
        episodes=episodes,
        checkpoint_gpu_seconds=round(gpu_seconds, 3),
        checkpoint_write_bytes=written,
        startup_seconds=startup,
        startup_gpu_seconds=round(startup * gpus, 3) if startup is not None else None,
        startup_read_bytes=read_before if startup is not None else None,
    )


def write_checkpoint(
    conn: Connection, key: tuple[str, int, datetime], estimate: CheckpointEstimate, now: datetime
) -> None:
    conn.execute(
        text(
            """
            INSERT INTO job_checkpoint (cluster, job_id_raw, submit_at, episodes, checkpoint_gpu_seconds,
                checkpoint_write_bytes, startup_seconds, startup_gpu_seconds, startup_read_bytes, computed_at)
            VALUES (:cluster, :raw, :submit, :episodes, :gpu, :written, :startup, :startup_gpu, :read, :now)
            ON CONFLICT (cluster, job_id_raw, submit_at) DO UPDATE
            SET episodes = EXCLUDED.episodes, checkpoint_gpu_seconds = EXCLUDED.checkpoint_gpu_seconds,
                checkpoint_write_bytes = EXCLUDED.checkpoint_write_bytes, startup_seconds = EXCLUDED.startup_seconds,
                startup_gpu_seconds = EXCLUDED.startup_gpu_seconds, startup_read_bytes = EXCLUDED.startup_read_bytes,
                computed_at = EXCLUDED.computed_at
            WHERE (job_checkpoint.episodes, job_checkpoint.checkpoint_gpu_seconds, job_checkpoint.checkpoint_write_bytes,
                   job_checkpoint.startup_seconds, job_checkpoint.startup_read_bytes)
                  IS DISTINCT FROM (EXCLUDED.episodes, EXCLUDED.checkpoint_gpu_seconds, EXCLUDED.checkpoint_write_bytes,
                                    EXCLUDED.startup_seconds, EXCLUDED.startup_read_bytes)
            """
        ),
        {
            "cluster": key[0], "raw": key[1], "submit": key[2], "episodes": estimate.episodes,
            "gpu": estimate.checkpoint_gpu_seconds, "written": estimate.checkpoint_write_bytes,
            "startup": estimate.startup_seconds, "startup_gpu": estimate.startup_gpu_seconds,
            "read": estimate.startup_read_bytes, "now": now,
        },
    )  # fmt: skip


def refresh_checkpoints(conn: Connection, thresholds: CheckpointThresholds, now: datetime) -> int:
    """job_checkpoint of the attribution run's dirty attempts that have ended (dirty_attempt,
    dirty_mapping), in one read of their cgroup and GPU windows: a running attempt's estimate
    is made when its job view is read."""
    conn.execute(text("DROP TABLE IF EXISTS checkpoint_candidate"))
    conn.execute(
        text(
            """
            CREATE TEMP TABLE checkpoint_candidate ON COMMIT DROP AS
            SELECT d.cluster, d.job_id_raw, d.submit_at, d.nodes, d.start_at, d.end_eff, d.alloc_gpus
            FROM dirty_attempt d JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
            WHERE a.end_at IS NOT NULL AND d.start_at IS NOT NULL
              AND EXISTS (SELECT 1 FROM job_host_window j
                          WHERE j.job_id = CAST(d.job_id_raw AS text) AND j.node = ANY (d.nodes)
                            AND j.window_start_at >= d.start_at - interval '1 minute'
                            AND j.window_start_at < d.end_eff)
            """
        )
    )
    attempts = {
        (r.cluster, r.job_id_raw, r.submit_at): (r.start_at, float(r.alloc_gpus))
        for r in conn.execute(text("SELECT * FROM checkpoint_candidate")).all()
    }
    if not attempts:
        return 0
    rows = conn.execute(
        text(
            """
            WITH host AS (
                SELECT c.cluster, c.job_id_raw, c.submit_at, j.window_start_at,
                       sum(j.write_bytes) AS written, sum(j.read_bytes) AS read, count(*) AS n
                FROM checkpoint_candidate c
                JOIN LATERAL (
                    SELECT j.window_start_at, j.write_bytes, j.read_bytes FROM job_host_window j
                    WHERE j.job_id = CAST(c.job_id_raw AS text) AND j.node = ANY (c.nodes)
                      AND j.window_start_at >= c.start_at - interval '1 minute' AND j.window_start_at < c.end_eff
                    OFFSET 0
                ) j ON true
                GROUP BY c.cluster, c.job_id_raw, c.submit_at, j.window_start_at
            ),
            -- the GPUs' windows of the start-up hour and of the write bursts only
            reads AS (
                SELECT c.cluster, c.job_id_raw, c.submit_at, c.start_at - interval '1 minute' AS lo,
                       least(c.end_eff, c.start_at + interval '1 hour') AS hi
                FROM checkpoint_candidate c
                UNION ALL
                SELECT h.cluster, h.job_id_raw, h.submit_at, h.window_start_at, h.window_start_at + interval '30 seconds'
                FROM host h
                JOIN checkpoint_candidate c USING (cluster, job_id_raw, submit_at)
                WHERE h.written >= :write_bytes AND h.window_start_at >= c.start_at + interval '1 hour'
            ),
            gpu AS (
                SELECT r.cluster, r.job_id_raw, r.submit_at, w.window_start_at,
                       avg(w.util_mean_percent) AS util, sum(least(w.idle_seconds, w.covered_seconds)) AS idle
                FROM reads r
                JOIN dirty_mapping m USING (cluster, job_id_raw, submit_at)
                CROSS JOIN LATERAL slurmtel_gpu_windows(ARRAY[m.gpu_uuid], r.lo, r.hi) w
                WHERE w.window_start_at >= r.lo AND w.window_start_at < r.hi
                GROUP BY r.cluster, r.job_id_raw, r.submit_at, w.window_start_at
            )
            SELECT cluster, job_id_raw, submit_at, window_start_at AS at, h.written, h.read, g.util, g.idle,
                   h.n IS NOT NULL AS measured
            FROM host h FULL JOIN gpu g USING (cluster, job_id_raw, submit_at, window_start_at)
            ORDER BY cluster, job_id_raw, submit_at, window_start_at
            """
        ),
        {"write_bytes": thresholds.write_bytes},
    ).all()
    done = 0
    for key, group in groupby(rows, key=lambda r: (r.cluster, r.job_id_raw, r.submit_at)):
        start_at, gpus = attempts[key]
        estimate = estimate_from_windows(list(group), start_at, gpus, thresholds)
        if estimate is not None:
            write_checkpoint(conn, key, estimate, now)
            done += 1
    return done


def delete_host_windows_before(conn: Connection, cutoff_at: datetime) -> int:
    """Retention of the host signals (telemetry.retention_days, like gpu_summary): the jobs' cgroup
    windows, the GPUs' throttle windows and the nodes' file system windows before CUTOFF_AT, and
    the Lustre snapshots before it except each entry's newest (the next snapshot's increase is
    taken from it: without it the entry would count again from its start)."""
    deleted = 0
    for table in ("job_host_window", "gpu_host_window", "node_fs_window"):
        result = conn.execute(
            text(f"DELETE FROM {table} WHERE window_start_at < :cutoff"), {"cutoff": cutoff_at}
        )
        deleted += int(result.rowcount or 0)
    result = conn.execute(
        text(
            """
            DELETE FROM lustre_job_stat s
            WHERE s.snapshot_at < :cutoff
              AND EXISTS (SELECT 1 FROM lustre_job_stat n
                          WHERE n.target = s.target AND n.job_name = s.job_name
                            AND n.snapshot_at > s.snapshot_at AND n.snapshot_at < :cutoff)
            """
        ),
        {"cutoff": cutoff_at},
    )
    return deleted + int(result.rowcount or 0)
