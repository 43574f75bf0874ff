"""The fabric and node-plane reports: all their SQL, their rows as frozen dataclasses.

- `fabric_report`: NCCL acceptance runs over time, each compared with the baseline of its
  node set, and the nodes most often in bad runs (suspects).
- `fabric_nodes_report`: InfiniBand/RoCE error and congestion rates per node and port, NVLink
  errors per GPU, beside the failed attempts on the same node in the same period.
- `drift_report`: nodes that differ from the majority of their partition (driver, CUDA, VBIOS,
  GPU model, GPU memory, GPU count, topology), since when.

All three are cluster-wide (nodes belong to nobody): a scope short of everything gets no rows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.reports_admin import no_jit

# ---------------------------------------------------------------- acceptance runs


@dataclass(frozen=True)
class FabricRunRow:
    """One acceptance run, and how it compares with the earlier ok runs of the same kind (the
    report lists them per node set and collective, in time order).

    Comparable runs share the cluster, node set, collective, ranks, data type and size range.
    `baseline_busbw_gbytes_per_second` is the median avg busbw of up to `fabric.baseline_runs` of the latest
    earlier ok ones (None: no earlier ok run); `below_baseline` when avg < fraction x baseline.
    Bandwidths in GB/s as nccl-tests prints them.
    """

    run_id: int
    run_at: datetime
    cluster: str
    job_id: str
    label: str
    collective: str
    ranks: int | None
    node_count: int
    hosts: tuple[str, ...]
    nodes: str
    gpu_model: str
    nccl_version: str
    tests_version: str
    driver_versions: tuple[str, ...]
    cuda_versions: tuple[str, ...]
    data_type: str
    max_size_bytes: int | None
    avg_busbw_gbytes_per_second: float | None
    peak_busbw_gbytes_per_second: float | None
    baseline_busbw_gbytes_per_second: float | None
    baseline_runs: int
    busbw_ratio: float | None
    below_baseline: bool
    wrong_values: int
    status: str
    reasons: tuple[str, ...]

    @property
    def bad(self) -> bool:
        return self.status != "ok" or self.below_baseline


@dataclass(frozen=True)
class FabricSuspectRow:
    """A node, ranked by how often it was in a bad run (not ok, or below its baseline)."""

    cluster: str
    node: str
    runs: int
    bad_runs: int
    bad_share: float
    failed_runs: int
    degraded_runs: int
    below_baseline_runs: int
    # runs whose failure banner named this host (a rank that failed there)
    named_in_failures: int
    last_bad_at: datetime | None


@dataclass(frozen=True)
class FabricReport:
    runs: list[FabricRunRow]
    suspects: list[FabricSuspectRow]


_RUNS_SQL = """
    SELECT r.id, r.run_at, r.cluster, r.job_id, r.label, r.collective, r.ranks, r.hosts, r.nodes,
           r.node_set, r.gpu_model, r.nccl_version, r.tests_version, r.data_type, r.max_size_bytes,
           r.avg_busbw_gbps, r.peak_busbw_gbps, r.wrong_values, r.status, r.reasons, r.failed_hosts,
           b.baseline, b.runs AS baseline_runs,
           coalesce((SELECT array_agg(DISTINCT n.driver_version ORDER BY n.driver_version)
                     FROM nccl_run_node n WHERE n.run_id = r.id AND n.driver_version <> ''), '{}') AS drivers,
           coalesce((SELECT array_agg(DISTINCT n.cuda_version ORDER BY n.cuda_version)
                     FROM nccl_run_node n WHERE n.run_id = r.id AND n.cuda_version <> ''), '{}') AS cudas
    FROM nccl_run r
    LEFT JOIN LATERAL (
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY e.avg_busbw_gbps) AS baseline, count(*) AS runs
        FROM (
            SELECT p.avg_busbw_gbps FROM nccl_run p
            WHERE p.status = 'ok' AND p.avg_busbw_gbps IS NOT NULL
              AND p.cluster = r.cluster AND p.node_set = r.node_set AND p.collective = r.collective
              AND p.ranks IS NOT DISTINCT FROM r.ranks AND p.data_type = r.data_type
              AND p.min_size_bytes IS NOT DISTINCT FROM r.min_size_bytes
              AND p.max_size_bytes IS NOT DISTINCT FROM r.max_size_bytes
              AND (p.run_at, p.id) < (r.run_at, r.id)
            ORDER BY p.run_at DESC, p.id DESC
            LIMIT :baseline_runs
        ) e
    ) b ON true
    WHERE r.run_at >= :start AND r.run_at < :end
      AND (cardinality(CAST(:f_clusters AS text[])) = 0 OR r.cluster = ANY(CAST(:f_clusters AS text[])))
    -- a time series per node set and collective
    ORDER BY r.cluster, r.node_set, r.collective, r.ranks, r.run_at, r.id
"""


def fabric_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    scope: Scope,
    baseline_fraction: float,
    baseline_runs: int,
    job_filter: JobFilter | None = None,
) -> FabricReport:
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    if not scope.everything:
        return FabricReport([], [])
    f = job_filter or JobFilter()
    no_jit(conn)
    result = conn.execute(
        text(_RUNS_SQL),
        {"start": start, "end": end, "baseline_runs": baseline_runs, "f_clusters": list(f.clusters)},
    )
    runs: list[FabricRunRow] = []
    failed_hosts: dict[int, tuple[str, ...]] = {}
    run_nodes: dict[int, tuple[str, ...]] = {}
    for r in result.mappings():
        baseline = float(r["baseline"]) if r["baseline"] is not None else None
        avg = r["avg_busbw_gbps"]
        ratio = round(avg / baseline, 4) if avg is not None and baseline else None
        runs.append(
            FabricRunRow(
                run_id=int(r["id"]),
                run_at=r["run_at"],
                cluster=r["cluster"],
                job_id=r["job_id"],
                label=r["label"],
                collective=r["collective"],
                ranks=r["ranks"],
                node_count=len(r["nodes"]),
                hosts=tuple(r["hosts"]),
                nodes=r["node_set"],
                gpu_model=r["gpu_model"],
                nccl_version=r["nccl_version"],
                tests_version=r["tests_version"],
                driver_versions=tuple(r["drivers"]),
                cuda_versions=tuple(r["cudas"]),
                data_type=r["data_type"],
                max_size_bytes=r["max_size_bytes"],
                avg_busbw_gbytes_per_second=avg,
                peak_busbw_gbytes_per_second=r["peak_busbw_gbps"],
                baseline_busbw_gbytes_per_second=round(baseline, 6) if baseline is not None else None,
                baseline_runs=int(r["baseline_runs"] or 0),
                busbw_ratio=ratio,
                below_baseline=ratio is not None and ratio < baseline_fraction,
                wrong_values=int(r["wrong_values"]),
                status=r["status"],
                reasons=tuple(r["reasons"]),
            )
        )
        failed_hosts[int(r["id"])] = tuple(r["failed_hosts"])
        run_nodes[int(r["id"])] = tuple(r["nodes"])
    return FabricReport(runs, _suspects(runs, run_nodes, failed_hosts))


def _suspects(
    runs: Sequence[FabricRunRow],
    run_nodes: dict[int, tuple[str, ...]],
    failed_hosts: dict[int, tuple[str, ...]],
) -> list[FabricSuspectRow]:
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    last_bad: dict[tuple[str, str], datetime] = {}
    for run in runs:
        named = {h.split(".", 1)[0] for h in failed_hosts[run.run_id]}
        for node in run_nodes[run.run_id]:
            c = counts[(run.cluster, node)]
            c["runs"] += 1
            c["failed"] += run.status == "failed"
            c["degraded"] += run.status == "degraded"
            c["below"] += run.below_baseline
            c["named"] += node in named
            if run.bad:
                c["bad"] += 1
                key = (run.cluster, node)
                last_bad[key] = max(last_bad.get(key, run.run_at), run.run_at)
    rows = [
        FabricSuspectRow(
            cluster=cluster,
            node=node,
            runs=c["runs"],
            bad_runs=c["bad"],
            bad_share=round(c["bad"] / c["runs"], 4),
            failed_runs=c["failed"],
            degraded_runs=c["degraded"],
            below_baseline_runs=c["below"],
            named_in_failures=c["named"],
            last_bad_at=last_bad.get((cluster, node)),
        )
        for (cluster, node), c in counts.items()
        if c["bad"]
    ]
    rows.sort(key=lambda s: (-s.named_in_failures, -s.bad_runs, -s.bad_share, s.cluster, s.node))
    return rows


# ---------------------------------------------------------------- counters per node and port

# IB PortCounters that count a fault on the link or the port
PORT_ERROR_COUNTERS = (
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "link_downed",
    "link_error_recovery",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
# transport retries and sequence errors (mlx5 hw_counters): retransmissions
RETRANSMIT_COUNTERS = (
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "local_ack_timeout_err",
    "packet_seq_err",
    "out_of_sequence",
    "implied_nak_seq_err",
    "rnr_nak_retry_err",
)
# congestion notifications sent and handled (RoCE ECN/CNP)
CONGESTION_COUNTERS = ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")


@dataclass(frozen=True)
class FabricPortRow:
    """One InfiniBand/RoCE port over the window: sums of its per-window increases."""

    node: str
    device: str
    port: int
    link_layer: str
    link_rate_gbits_per_second: float | None
    state: str
    phys_state: str
    windows: int
    measured_seconds: float
    errors: int
    errors_per_hour: float | None
    symbol_errors: int
    receive_errors: int
    link_downed: int
    link_error_recoveries: int
    xmit_discards: int
    retransmissions: int
    retransmissions_per_hour: float | None
    # ticks with data to send and no credit to send it: congestion
    xmit_wait_ticks: int
    xmit_wait_ticks_per_second: float | None
    congestion_notifications: int
    out_of_buffer: int
    xmit_bytes: int
    rcv_bytes: int
    xmit_bytes_per_second: float | None
    rcv_bytes_per_second: float | None
    counter_resets: int
    saturated_counters: tuple[str, ...]
    failed_attempts: int
    node_fail_attempts: int
    failed_nccl_runs: int


@dataclass(frozen=True)
class FabricNvlinkRow:
    """One GPU's NVLinks over the window."""

    node: str
    gpu_uuid: str
    links_active_min: int
    links_active_max: int
    links_total: int
    windows: int
    measured_seconds: float
    replay_errors: int
    recovery_errors: int
    crc_errors: int
    ecc_errors: int
    errors_per_hour: float | None
    tx_bytes: int
    rx_bytes: int
    tx_bytes_per_second: float | None
    # "LINK:counter=N" for the links whose errors grew
    error_links: tuple[str, ...]
    failed_attempts: int
    node_fail_attempts: int
    # as nvidia-smi numbers it on the node (the inventory), None where unknown
    gpu_index: int | None = None


@dataclass(frozen=True)
class FabricNodesReport:
    ports: list[FabricPortRow]
    nvlinks: list[FabricNvlinkRow]


def _sum(counters: Sequence[str]) -> str:
    return " + ".join(f"coalesce(sum((w.deltas->>'{c}')::bigint), 0)" for c in counters)


_NODE_ATTEMPTS_SQL = """
    SELECT n.node,
           count(*) FILTER (WHERE slurmtel_failed(a.outcome)) AS failed,
           count(*) FILTER (WHERE a.state = 'NODE_FAIL') AS node_fail
    FROM job_attempt_outcome a CROSS JOIN LATERAL unnest(a.nodes) AS n(node)
    WHERE a.start_at IS NOT NULL AND a.start_at < :end AND coalesce(a.end_at, :now) > :start
      AND (cardinality(CAST(:f_clusters AS text[])) = 0 OR a.cluster = ANY(CAST(:f_clusters AS text[])))
    GROUP BY n.node
"""

_PORTS_SQL = f"""
    WITH attempts AS ({_NODE_ATTEMPTS_SQL}),
    nccl AS (
        SELECT n.node, count(*) AS failed
        FROM nccl_run r JOIN nccl_run_node n ON n.run_id = r.id
        WHERE r.status = 'failed' AND r.run_at >= :start AND r.run_at < :end
        GROUP BY n.node
    ),
    ports AS (
        SELECT w.node, w.device, w.port,
               (array_agg(w.link_layer ORDER BY w.window_start_at DESC))[1] AS link_layer,
               (array_agg(w.rate_gbps ORDER BY w.window_start_at DESC))[1] AS rate_gbps,
               (array_agg(w.state ORDER BY w.window_start_at DESC))[1] AS state,
               (array_agg(w.phys_state ORDER BY w.window_start_at DESC))[1] AS phys_state,
               count(*) AS windows, sum(w.window_seconds) AS seconds,
               {_sum(PORT_ERROR_COUNTERS)} AS errors,
               {_sum(("symbol_error",))} AS symbol_errors,
               {_sum(("port_rcv_errors", "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors"))}
                   AS receive_errors,
               {_sum(("link_downed",))} AS link_downed,
               {_sum(("link_error_recovery",))} AS link_error_recovery,
               {_sum(("port_xmit_discards",))} AS xmit_discards,
               {_sum(RETRANSMIT_COUNTERS)} AS retransmissions,
               {_sum(("port_xmit_wait",))} AS xmit_wait,
               {_sum(CONGESTION_COUNTERS)} AS congestion,
               {_sum(("out_of_buffer",))} AS out_of_buffer,
               {_sum(("port_xmit_data",))} * 4 AS xmit_bytes,
               {_sum(("port_rcv_data",))} * 4 AS rcv_bytes,
               coalesce(sum(cardinality(w.resets)), 0) AS resets,
               (SELECT array_agg(DISTINCT s ORDER BY s) FROM fabric_port_window x CROSS JOIN unnest(x.saturated) s
                WHERE x.node = w.node AND x.device = w.device AND x.port = w.port
                  AND x.window_start_at >= :start AND x.window_start_at < :end) AS saturated
        FROM fabric_port_window w
        WHERE w.window_start_at >= :start AND w.window_start_at < :end
        GROUP BY w.node, w.device, w.port
    )
    SELECT p.*, coalesce(a.failed, 0) AS failed, coalesce(a.node_fail, 0) AS node_fail,
           coalesce(nc.failed, 0) AS nccl_failed
    FROM ports p LEFT JOIN attempts a ON a.node = p.node LEFT JOIN nccl nc ON nc.node = p.node
    WHERE cardinality(CAST(:f_nodes AS text[])) = 0 OR p.node = ANY(CAST(:f_nodes AS text[]))
    ORDER BY p.errors DESC, p.retransmissions DESC, p.xmit_wait DESC, p.node, p.device, p.port
"""

_NVLINKS_SQL = f"""
    WITH attempts AS ({_NODE_ATTEMPTS_SQL}),
    gpus AS (
        SELECT w.node, w.gpu_uuid, min(w.links_active) AS active_min, max(w.links_active) AS active_max,
               max(w.links_total) AS links_total, count(*) AS windows, sum(w.window_seconds) AS seconds,
               coalesce(sum((w.errors->>'replay')::bigint), 0) AS replay,
               coalesce(sum((w.errors->>'recovery')::bigint), 0) AS recovery,
               coalesce(sum((w.errors->>'crc_flit')::bigint), 0) + coalesce(sum((w.errors->>'crc_data')::bigint), 0)
                   AS crc,
               coalesce(sum((w.errors->>'ecc_data')::bigint), 0) AS ecc,
               coalesce(sum(w.tx_bytes), 0) AS tx_bytes, coalesce(sum(w.rx_bytes), 0) AS rx_bytes,
               (SELECT array_agg(e.key || '=' || e.total ORDER BY e.key)
                FROM (SELECT le.key, sum(le.value::bigint) AS total
                      FROM nvlink_window x CROSS JOIN jsonb_each_text(x.link_errors) le
                      WHERE x.gpu_uuid = w.gpu_uuid AND x.window_start_at >= :start AND x.window_start_at < :end
                      GROUP BY le.key) e) AS error_links
        FROM nvlink_window w
        WHERE w.window_start_at >= :start AND w.window_start_at < :end
        GROUP BY w.node, w.gpu_uuid
    )
    SELECT g.*, coalesce(a.failed, 0) AS failed, coalesce(a.node_fail, 0) AS node_fail,
           (SELECT i.gpu_index FROM gpu_inventory i WHERE i.node = g.node AND i.gpu_uuid = g.gpu_uuid
            ORDER BY i.last_seen_at DESC LIMIT 1) AS gpu_index
    FROM gpus g LEFT JOIN attempts a ON a.node = g.node
    WHERE cardinality(CAST(:f_nodes AS text[])) = 0 OR g.node = ANY(CAST(:f_nodes AS text[]))
    ORDER BY (g.replay + g.recovery + g.crc + g.ecc) DESC, g.active_max - g.active_min DESC, g.node, g.gpu_uuid
"""


def _rate(count: Any, seconds: Any, per: float) -> float | None:
    if not seconds:
        return None
    return round(float(count) / float(seconds) * per, 4)


def fabric_nodes_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    scope: Scope,
    job_filter: JobFilter | None = None,
    nodes: Sequence[str] = (),
) -> FabricNodesReport:
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    if not scope.everything:
        return FabricNodesReport([], [])
    f = job_filter or JobFilter()
    bind = {"start": start, "end": end, "now": now, "f_clusters": list(f.clusters), "f_nodes": list(nodes)}
    no_jit(conn)
    ports = [
        FabricPortRow(
            node=r["node"],
            device=r["device"],
            port=int(r["port"]),
            link_layer=r["link_layer"],
            link_rate_gbits_per_second=r["rate_gbps"],
            state=r["state"],
            phys_state=r["phys_state"],
            windows=int(r["windows"]),
            measured_seconds=round(float(r["seconds"]), 1),
            errors=int(r["errors"]),
            errors_per_hour=_rate(r["errors"], r["seconds"], 3600),
            symbol_errors=int(r["symbol_errors"]),
            receive_errors=int(r["receive_errors"]),
            link_downed=int(r["link_downed"]),
            link_error_recoveries=int(r["link_error_recovery"]),
            xmit_discards=int(r["xmit_discards"]),
            retransmissions=int(r["retransmissions"]),
            retransmissions_per_hour=_rate(r["retransmissions"], r["seconds"], 3600),
            xmit_wait_ticks=int(r["xmit_wait"]),
            xmit_wait_ticks_per_second=_rate(r["xmit_wait"], r["seconds"], 1),
            congestion_notifications=int(r["congestion"]),
            out_of_buffer=int(r["out_of_buffer"]),
            xmit_bytes=int(r["xmit_bytes"]),
            rcv_bytes=int(r["rcv_bytes"]),
            xmit_bytes_per_second=_rate(r["xmit_bytes"], r["seconds"], 1),
            rcv_bytes_per_second=_rate(r["rcv_bytes"], r["seconds"], 1),
            counter_resets=int(r["resets"]),
            saturated_counters=tuple(r["saturated"] or ()),
            failed_attempts=int(r["failed"]),
            node_fail_attempts=int(r["node_fail"]),
            failed_nccl_runs=int(r["nccl_failed"]),
        )
        for r in conn.execute(text(_PORTS_SQL), bind).mappings()
    ]
    nvlinks = [
        FabricNvlinkRow(
            node=r["node"],
            gpu_uuid=r["gpu_uuid"],
            links_active_min=int(r["active_min"]),
            links_active_max=int(r["active_max"]),
            links_total=int(r["links_total"]),
            windows=int(r["windows"]),
            measured_seconds=round(float(r["seconds"]), 1),
            replay_errors=int(r["replay"]),
            recovery_errors=int(r["recovery"]),
            crc_errors=int(r["crc"]),
            ecc_errors=int(r["ecc"]),
            errors_per_hour=_rate(
                int(r["replay"]) + int(r["recovery"]) + int(r["crc"]) + int(r["ecc"]), r["seconds"], 3600
            ),
            tx_bytes=int(r["tx_bytes"]),
            rx_bytes=int(r["rx_bytes"]),
            tx_bytes_per_second=_rate(r["tx_bytes"], r["seconds"], 1),
            error_links=tuple(r["error_links"] or ()),
            failed_attempts=int(r["failed"]),
            node_fail_attempts=int(r["node_fail"]),
            gpu_index=None if r["gpu_index"] is None else int(r["gpu_index"]),
        )
        for r in conn.execute(text(_NVLINKS_SQL), bind).mappings()
    ]
    return FabricNodesReport(ports, nvlinks)


# ---------------------------------------------------------------- drift

DRIFT_ATTRIBUTES = (
    "driver_version",
    "cuda_version",
    "vbios_version",
    "gpu_model",
    "gpu_memory_bytes",
    "gpus",
    "topology",
)


@dataclass(frozen=True)
class NodeDriftRow:
    """A node whose ATTRIBUTE differs from the most common value among its partition's nodes
    (majority_value "": no value is the most common, the partition is split)."""

    cluster: str
    partition: str
    node: str
    attribute: str
    value: str
    majority_value: str
    majority_nodes: int
    partition_nodes: int
    # since when the node has had this value (its first observation of it since another one)
    since_at: datetime | None


_HISTORY_SQL = """
    WITH latest_state AS (
        SELECT DISTINCT ON (cluster, node) cluster, node, partitions
        FROM node_state
        WHERE cardinality(CAST(:f_clusters AS text[])) = 0 OR cluster = ANY(CAST(:f_clusters AS text[]))
        ORDER BY cluster, node, last_seen_at DESC
    ),
    observations AS (
        -- one inventory observation of a node: every GPU seen until the same moment
        SELECT i.node, i.last_seen_at AS seen_at, min(i.first_seen_at) AS first_at,
               mode() WITHIN GROUP (ORDER BY i.driver_version) AS driver_version,
               mode() WITHIN GROUP (ORDER BY i.cuda_version) AS cuda_version,
               mode() WITHIN GROUP (ORDER BY i.vbios_version) AS vbios_version,
               mode() WITHIN GROUP (ORDER BY i.model) AS gpu_model,
               mode() WITHIN GROUP (ORDER BY i.memory_total_bytes) AS gpu_memory_bytes,
               count(DISTINCT i.gpu_uuid) AS gpus
        FROM gpu_inventory i
        WHERE i.parent_gpu_uuid = ''
        GROUP BY i.node, i.last_seen_at
    )
    SELECT o.*, coalesce(s.cluster, '') AS cluster, coalesce(s.partitions, '{}') AS partitions
    FROM observations o LEFT JOIN latest_state s ON s.node = o.node
    WHERE cardinality(CAST(:f_clusters AS text[])) = 0 OR s.cluster IS NOT NULL
    ORDER BY o.node, o.seen_at
"""

_TOPOLOGY_SQL = """
    SELECT node, summary, first_seen_at, last_seen_at FROM node_topology
    ORDER BY node, (source = 'nvml') DESC, last_seen_at
"""


def drift_report(
    conn: Connection, *, scope: Scope, job_filter: JobFilter | None = None
) -> list[NodeDriftRow]:
    """Per partition, the nodes whose latest value of an attribute is not the partition's most
    common one; where two values tie for most common, every node of the partition, with
    majority_value "" (the partition is split)."""
    if not scope.everything:
        return []
    f = job_filter or JobFilter()
    no_jit(conn)
    history: dict[str, list[dict[str, Any]]] = defaultdict(list)
    where: dict[str, tuple[str, tuple[str, ...]]] = {}
    for r in conn.execute(text(_HISTORY_SQL), {"f_clusters": list(f.clusters)}).mappings():
        row = dict(r)
        history[row["node"]].append(row)
        where[row["node"]] = (row["cluster"], tuple(row["partitions"]) or ("",))
    topologies: dict[str, list[tuple[str, datetime, datetime]]] = defaultdict(list)
    for r in conn.execute(text(_TOPOLOGY_SQL)).mappings():
        topologies[r["node"]].append((r["summary"], r["first_seen_at"], r["last_seen_at"]))
    current: dict[str, dict[str, tuple[str, datetime | None]]] = {}
    for node, observations in history.items():
        values: dict[str, tuple[str, datetime | None]] = {}
        for attribute in DRIFT_ATTRIBUTES[:-1]:
            timeline = [(_text(o[attribute]), o["first_at"], o["seen_at"]) for o in observations]
            values[attribute] = _current(timeline)
        if node in topologies:
            values["topology"] = _current(topologies[node])
        current[node] = values
    members: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node, (cluster, partitions) in where.items():
        for partition in partitions:
            if not f.partitions or partition in f.partitions:
                members[(cluster, partition)].append(node)
    rows: list[NodeDriftRow] = []
    for (cluster, partition), nodes in sorted(members.items()):
        for attribute in DRIFT_ATTRIBUTES:
            seen = {
                n: current[n][attribute]
                for n in nodes
                if attribute in current[n] and current[n][attribute][0]
            }
            if len(seen) < 2:
                continue
            counts = Counter(value for value, _ in seen.values())
            top = max(counts.values())
            leaders = [v for v, n in counts.items() if n == top]
            # a split partition (two values as common as each other) has no majority: every
            # node is listed, each with its own value
            majority = leaders[0] if len(leaders) == 1 else ""
            for node, (value, since) in sorted(seen.items()):
                if value != majority:
                    rows.append(
                        NodeDriftRow(
                            cluster=cluster,
                            partition=partition,
                            node=node,
                            attribute=attribute,
                            value=value,
                            majority_value=majority,
                            majority_nodes=top,
                            partition_nodes=len(seen),
                            since_at=since,
                        )
                    )
    rows.sort(key=lambda r: (r.cluster, r.partition, r.node, DRIFT_ATTRIBUTES.index(r.attribute)))
    return rows


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _current(timeline: Sequence[tuple[str, datetime, datetime]]) -> tuple[str, datetime | None]:
    """The latest value of a (value, first seen, last seen) history, and since when it holds:
    its first observation after the last one of any other value."""
    if not timeline:
        return "", None
    value = max(timeline, key=lambda t: t[2])[0]
    others = [last for v, _, last in timeline if v != value]
    cutoff = max(others) if others else None
    firsts = [first for v, first, last in timeline if v == value and (cutoff is None or last > cutoff)]
    return value, min(firsts) if firsts else None
