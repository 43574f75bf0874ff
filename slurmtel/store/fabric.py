"""The fabric and node planes' writes: NCCL acceptance runs, the daemon's pickup of acceptance
jobs' StdOut files, InfiniBand/RoCE port and NVLink counter windows, GPU topology history.

Every write is idempotent on a natural key: a log on (sha256 of its bytes, the job it belongs
to), counter windows on (node, device, port | GPU, window start), a topology on (node, source,
what it is) with first/last seen times. The reports on these tables are in
store/reports_fabric.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Connection, text

from slurmtel.records import NcclRun, NodeTopology, NvlinkCounters, PortCounters

# ---------------------------------------------------------------- NCCL runs


@dataclass(frozen=True)
class JobRef:
    """The attempt an acceptance log is the StdOut of."""

    cluster: str
    job_id_raw: int
    submit_at: datetime
    job_id: str
    start_at: datetime | None
    end_at: datetime | None
    nodes: tuple[str, ...]
    name: str = ""
    user: str = ""
    work_dir: str = ""
    stdout_path: str = ""
    stdout_pattern: str = ""
    submit_line: str = ""
    array_job_id: int | None = None
    array_task_id: int | None = None

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.job_id_raw}/{self.submit_at.isoformat()}"


@dataclass(frozen=True)
class NcclLogWrite:
    """One log and its runs, as the nccl source hands them to the store."""

    log_sha256: str
    origin: str
    bytes: int
    runs: Sequence[NcclRun]
    job: JobRef | None
    label: str
    # when the runs ran: the job's end or start, else when the log was read
    run_at: datetime


@dataclass(frozen=True)
class NcclWriteStats:
    # False: the same log (and job) was stored before; nothing was written
    new: bool
    runs: int
    log_id: int | None


_ATTEMPT_COLUMNS = (
    "cluster, job_id_raw, submit_at, job_id, start_at, end_at, nodes, name, user_name, work_dir, "
    "stdout_path, stdout_pattern, submit_line, array_job_id, array_task_id"
)


def _job_ref(row: Any) -> JobRef:
    return JobRef(
        cluster=row.cluster,
        job_id_raw=int(row.job_id_raw),
        submit_at=row.submit_at,
        job_id=row.job_id,
        start_at=row.start_at,
        end_at=row.end_at,
        nodes=tuple(row.nodes or ()),
        name=row.name,
        user=row.user_name,
        work_dir=row.work_dir,
        stdout_path=row.stdout_path,
        stdout_pattern=row.stdout_pattern,
        submit_line=row.submit_line,
        array_job_id=row.array_job_id,
        array_task_id=row.array_task_id,
    )


def find_job(conn: Connection, job: str, cluster: str = "") -> list[JobRef]:
    """The attempts of the job users call JOB ("123", "10_4") or whose raw id it is, newest
    first; in CLUSTER when given."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_ATTEMPT_COLUMNS} FROM job_attempt
            WHERE (job_id = :job OR (:job ~ '^[0-9]+$' AND job_id_raw = CAST(:raw AS bigint)))
              AND (CAST(:cluster AS text) = '' OR cluster = CAST(:cluster AS text))
            ORDER BY submit_at DESC
            """
        ),
        {"job": job, "raw": job if job.isdigit() and len(job) < 19 else "0", "cluster": cluster},
    )
    return [_job_ref(r) for r in rows]


def write_nccl_log(conn: Connection, log: NcclLogWrite) -> NcclWriteStats:
    """Store a log and its runs once: the same bytes for the same job again change nothing."""
    job_ref = log.job.key if log.job else ""
    log_id = conn.execute(
        text(
            """
            INSERT INTO nccl_log (log_sha256, job_ref, origin, label, bytes, runs)
            VALUES (:sha, :job_ref, :origin, :label, :bytes, :runs)
            ON CONFLICT (log_sha256, job_ref) DO NOTHING
            RETURNING id
            """
        ),
        {
            "sha": log.log_sha256,
            "job_ref": job_ref,
            "origin": log.origin,
            "label": log.label,
            "bytes": log.bytes,
            "runs": len(log.runs),
        },
    ).scalar()
    if log_id is None:
        return NcclWriteStats(False, 0, None)
    job = log.job
    for run in log.runs:
        nodes = _run_nodes(run, job)
        run_id = conn.execute(
            text(
                """
                INSERT INTO nccl_run (log_id, run_index, cluster, job_id_raw, job_submit_at, job_id, label,
                    run_at, tool, collective, collective_source, status, reasons, tests_version,
                    nccl_version, library, ranks, hosts, nodes, node_set, gpu_model, data_type,
                    min_size_bytes, max_size_bytes, sizes, avg_busbw_gbps, avg_busbw_source,
                    peak_busbw_gbps, wrong_values, out_of_bounds_values, footer_seen, failed_hosts,
                    validation, header, results, rank_devices)
                VALUES (:log_id, :run_index, :cluster, :job_id_raw, :job_submit_at, :job_id, :label,
                    :run_at, :tool, :collective, :collective_source, :status, :reasons, :tests_version,
                    :nccl_version, :library, :ranks, :hosts, :nodes, :node_set, :gpu_model, :data_type,
                    :min_size, :max_size, :sizes, :avg, :avg_source, :peak, :wrong, :oob, :footer,
                    :failed_hosts, :validation, CAST(:header AS jsonb), CAST(:results AS jsonb),
                    CAST(:rank_devices AS jsonb))
                RETURNING id
                """
            ),
            {
                "log_id": log_id,
                "run_index": run.index,
                "cluster": job.cluster if job else "",
                "job_id_raw": job.job_id_raw if job else None,
                "job_submit_at": job.submit_at if job else None,
                "job_id": job.job_id if job else "",
                "label": log.label,
                "run_at": log.run_at,
                "tool": run.tool,
                "collective": run.collective,
                "collective_source": run.collective_source,
                "status": run.status,
                "reasons": list(run.reasons),
                "tests_version": run.tests_version,
                "nccl_version": run.nccl_version,
                "library": run.library,
                "ranks": run.ranks,
                "hosts": list(run.hosts),
                "nodes": sorted(nodes),
                "node_set": ",".join(sorted(nodes)),
                "gpu_model": run.gpu_model,
                "data_type": _data_type(run),
                "min_size": min((r.size_bytes for r in run.results), default=run.min_bytes),
                "max_size": max((r.size_bytes for r in run.results), default=run.max_bytes),
                "sizes": len(run.results),
                "avg": run.avg_busbw_gbps,
                "avg_source": run.avg_busbw_source,
                "peak": run.peak_busbw_gbps,
                "wrong": run.wrong_values,
                "oob": run.out_of_bounds_values,
                "footer": run.footer_seen,
                "failed_hosts": list(run.failed_hosts),
                "validation": run.validation,
                "header": _json(
                    {
                        "threads": run.threads,
                        "gpus_per_process": run.gpus_per_process,
                        "min_bytes": run.min_bytes,
                        "max_bytes": run.max_bytes,
                        "iterations": run.iterations,
                        "warmup_iterations": run.warmup_iterations,
                    }
                ),
                "results": _json([dataclasses.asdict(r) for r in run.results]),
                "rank_devices": _json([dataclasses.asdict(r) for r in run.rank_devices]),
            },
        ).scalar_one()
        _write_run_nodes(conn, run_id, run, nodes, log.run_at)
    return NcclWriteStats(True, len(log.runs), int(log_id))


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _data_type(run: NcclRun) -> str:
    types = {r.data_type for r in run.results}
    return types.pop() if len(types) == 1 else ",".join(sorted(types))


def short_host(host: str) -> str:
    """A host name as Slurm names nodes: without its domain."""
    return host.split(".", 1)[0]


def _run_nodes(run: NcclRun, job: JobRef | None) -> dict[str, str]:
    """node -> the host of the log that is it ("" where no host matches a job node)."""
    hosts = {short_host(h): h for h in run.hosts}
    if job is not None and job.nodes:
        return {node: hosts.get(node, "") for node in job.nodes}
    return dict(hosts) if hosts else {}


def _write_run_nodes(
    conn: Connection, run_id: int, run: NcclRun, nodes: dict[str, str], at: datetime
) -> None:
    if not nodes:
        return
    ranks_on: dict[str, int] = {}
    for rank in run.rank_devices:
        ranks_on[rank.host] = ranks_on.get(rank.host, 0) + 1
    # each node's software when the run ran: its inventory then (the observation around that
    # time, else the nearest one), the most common value among its GPUs
    conn.execute(
        text(
            """
            INSERT INTO nccl_run_node (run_id, node, host, ranks, gpu_model, driver_version, cuda_version,
                vbios_version)
            SELECT :run_id, n.node, n.host, n.ranks, coalesce(nullif(inv.model, ''), :gpu_model),
                   coalesce(inv.driver_version, ''), coalesce(inv.cuda_version, ''),
                   coalesce(inv.vbios_version, '')
            FROM unnest(CAST(:nodes AS text[]), CAST(:hosts AS text[]), CAST(:ranks AS int[]))
                 AS n(node, host, ranks)
            LEFT JOIN LATERAL (
                SELECT mode() WITHIN GROUP (ORDER BY i.model) AS model,
                       mode() WITHIN GROUP (ORDER BY i.driver_version) AS driver_version,
                       mode() WITHIN GROUP (ORDER BY i.cuda_version) AS cuda_version,
                       mode() WITHIN GROUP (ORDER BY i.vbios_version) AS vbios_version
                FROM gpu_inventory i
                WHERE i.node = n.node AND i.parent_gpu_uuid = ''
                  AND i.last_seen_at = (
                      SELECT j.last_seen_at FROM gpu_inventory j
                      WHERE j.node = n.node AND j.parent_gpu_uuid = ''
                      ORDER BY (j.first_seen_at <= :at AND j.last_seen_at >= :at) DESC,
                               abs(extract(epoch FROM j.last_seen_at - CAST(:at AS timestamptz)))
                      LIMIT 1)
            ) inv ON true
            ON CONFLICT (run_id, node) DO NOTHING
            """
        ),
        {
            "run_id": run_id,
            "nodes": list(nodes),
            "hosts": list(nodes.values()),
            "ranks": [ranks_on.get(h, 0) if h else 0 for h in nodes.values()],
            "gpu_model": run.gpu_model,
            "at": at,
        },
    )


# ---------------------------------------------------------------- the daemon's pickup


def pickup_candidates(
    conn: Connection, *, name_pattern: str, ended_after: datetime, now: datetime, limit: int
) -> list[JobRef]:
    """Ended attempts whose job name matches NAME_PATTERN (a PostgreSQL regular expression)
    and whose StdOut was neither stored nor quarantined yet, oldest first."""
    rows = conn.execute(
        text(
            f"""
            SELECT {", ".join("a." + c.strip() for c in _ATTEMPT_COLUMNS.split(","))}
            FROM job_attempt a
            LEFT JOIN nccl_pickup p USING (cluster, job_id_raw, submit_at)
            WHERE a.end_at IS NOT NULL AND a.end_at >= :after AND a.end_at <= :now
              AND a.start_at IS NOT NULL
              AND a.name ~ :pattern
              AND (p.status IS NULL OR p.status = 'waiting')
            ORDER BY a.end_at, a.cluster, a.job_id_raw
            LIMIT :limit
            """
        ),
        {"pattern": name_pattern, "after": ended_after, "now": now, "limit": limit},
    )
    return [_job_ref(r) for r in rows]


def record_pickup(
    conn: Connection, job: JobRef, *, status: str, path: str, message: str, at: datetime
) -> None:
    conn.execute(
        text(
            """
            INSERT INTO nccl_pickup (cluster, job_id_raw, submit_at, status, path, message,
                first_tried_at, last_tried_at)
            VALUES (:cluster, :raw, :submit, :status, :path, :message, :at, :at)
            ON CONFLICT (cluster, job_id_raw, submit_at) DO UPDATE
            SET status = EXCLUDED.status, path = EXCLUDED.path, message = EXCLUDED.message,
                tries = nccl_pickup.tries + 1, last_tried_at = EXCLUDED.last_tried_at
            """
        ),
        {
            "cluster": job.cluster,
            "raw": job.job_id_raw,
            "submit": job.submit_at,
            "status": status,
            "path": path,
            "message": message,
            "at": at,
        },
    )


# ---------------------------------------------------------------- counters from the node agents


def write_port_counters(conn: Connection, windows: Iterable[PortCounters]) -> int:
    rows = [
        {
            "node": w.node,
            "device": w.device,
            "port": w.port,
            "at": w.window_start_at,
            "seconds": w.window_seconds,
            "link_layer": w.link_layer,
            "state": w.state,
            "phys_state": w.phys_state,
            "rate": w.rate_gbps,
            "deltas": _json(w.deltas),
            "resets": list(w.resets),
            "saturated": list(w.saturated),
        }
        for w in windows
    ]
    if not rows:
        return 0
    result = conn.execute(
        text(
            """
            INSERT INTO fabric_port_window (node, device, port, window_start_at, window_seconds, link_layer,
                state, phys_state, rate_gbps, deltas, resets, saturated)
            VALUES (:node, :device, :port, :at, :seconds, :link_layer, :state, :phys_state, :rate,
                CAST(:deltas AS jsonb), :resets, :saturated)
            ON CONFLICT (node, device, port, window_start_at) DO NOTHING
            """
        ),
        rows,
    )
    return int(result.rowcount or 0)


def write_nvlink_counters(conn: Connection, windows: Iterable[NvlinkCounters]) -> int:
    rows = [
        {
            "node": w.node,
            "uuid": w.gpu_uuid,
            "at": w.window_start_at,
            "seconds": w.window_seconds,
            "active": w.links_active,
            "total": w.links_total,
            "tx": w.tx_bytes,
            "rx": w.rx_bytes,
            "errors": _json(w.errors),
            "link_errors": _json(w.link_errors),
            "resets": list(w.resets),
        }
        for w in windows
    ]
    if not rows:
        return 0
    result = conn.execute(
        text(
            """
            INSERT INTO nvlink_window (node, gpu_uuid, window_start_at, window_seconds, links_active,
                links_total, tx_bytes, rx_bytes, errors, link_errors, resets)
            VALUES (:node, :uuid, :at, :seconds, :active, :total, :tx, :rx, CAST(:errors AS jsonb),
                CAST(:link_errors AS jsonb), :resets)
            ON CONFLICT (gpu_uuid, window_start_at) DO NOTHING
            """
        ),
        rows,
    )
    return int(result.rowcount or 0)


def write_topology(conn: Connection, topologies: Iterable[NodeTopology]) -> int:
    """One row per distinct topology of a node; seeing it again extends its first/last seen."""
    rows = [
        {
            "node": t.node,
            "source": t.source,
            "summary": t.summary,
            "devices": list(t.devices),
            "links": list(t.links),
            "uuids": list(t.gpu_uuids),
            "cpu": list(t.cpu_affinity),
            "numa": list(t.numa_affinity),
            "nics": list(t.nic_names),
            "p2p": list(t.p2p),
            "at": t.observed_at,
        }
        for t in topologies
    ]
    if not rows:
        return 0
    conn.execute(
        text(
            """
            INSERT INTO node_topology (node, source, summary, devices, links, gpu_uuids, cpu_affinity,
                numa_affinity, nic_names, p2p, first_seen_at, last_seen_at)
            VALUES (:node, :source, :summary, :devices, :links, :uuids, :cpu, :numa, :nics, :p2p, :at, :at)
            ON CONFLICT (node, source, summary, links) DO UPDATE
            SET first_seen_at = least(node_topology.first_seen_at, EXCLUDED.first_seen_at),
                last_seen_at = greatest(node_topology.last_seen_at, EXCLUDED.last_seen_at),
                gpu_uuids = EXCLUDED.gpu_uuids, cpu_affinity = EXCLUDED.cpu_affinity,
                numa_affinity = EXCLUDED.numa_affinity, nic_names = EXCLUDED.nic_names, p2p = EXCLUDED.p2p
            """
        ),
        rows,
    )
    return len(rows)


def delete_counter_windows_before(conn: Connection, cutoff_at: datetime) -> int:
    """Retention of the per-window counters (telemetry.retention_days, like gpu_summary)."""
    deleted = 0
    for table in ("fabric_port_window", "nvlink_window"):
        result = conn.execute(
            text(f"DELETE FROM {table} WHERE window_start_at < :cutoff"), {"cutoff": cutoff_at}
        )
        deleted += int(result.rowcount or 0)
    return deleted
