"""Telemetry storage: GPU window summaries (partitioned by day, COPY), events, inventory,
live GPU allocations, node states and pending jobs.

This module is the one seam in front of the raw sample store (DESIGN §5): attribution reads
summaries only through the views and functions here, so a Citus or Prometheus-backed store
can replace it without touching attribution.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from operator import attrgetter
from typing import Any

from psycopg.errors import UniqueViolation
from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from slurmtel.gcpause import gc_paused
from slurmtel.records import GpuAllocation, GpuEvent, GpuInventory, GpuSummary, NodeState, PendingJob
from slurmtel.store.checks import record_problem, sort_out, value_problem
from slurmtel.store.copy import ROW_ERRORS, copy_rows, copy_rows_isolating
from slurmtel.store.locks import PARTITION_LOCK_KEY, advisory_xact_lock

PARTITIONED_TABLE = "gpu_summary"

# (column, PostgreSQL type): every GpuSummary field, stored under its own name
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("source", "text"),
    ("node", "text"),
    ("gpu_uuid", "text"),
    ("window_start_at", "timestamptz"),
    ("window_seconds", "float4"),
    ("util_metric", "text"),
    ("sample_count", "int4"),
    ("covered_seconds", "float4"),
    ("util_mean_percent", "float4"),
    ("util_max_percent", "float4"),
    ("idle_seconds", "float4"),
    ("no_process_seconds", "float4"),
    ("memory_used_mean_bytes", "int8"),
    ("memory_used_max_bytes", "int8"),
    ("memory_total_bytes", "int8"),
    ("power_mean_watts", "float4"),
    ("energy_joules", "float8"),
    ("energy_method", "text"),
    ("temperature_max_celsius", "float4"),
    ("sm_clock_max_mhz", "float4"),
    ("job_ids", "text[]"),
)
_COPY_COLUMNS = [*SUMMARY_COLUMNS, ("batch_id", "int8")]


@dataclass(frozen=True)
class SummaryWriteStats:
    batch_id: int | None
    received: int
    inserted: int
    # summaries that cannot be stored, with the reason naming the field (the caller quarantines)
    refused: tuple[tuple[GpuSummary, str], ...] = ()

    @property
    def duplicates(self) -> int:
        return self.received - self.inserted - len(self.refused)


_SUMMARY_ROW = attrgetter(*(c for c, _ in SUMMARY_COLUMNS))


def summary_rows(summaries: Iterable[GpuSummary], batch_id: int) -> list[tuple[Any, ...]]:
    return [(*_SUMMARY_ROW(s), batch_id) for s in summaries]


# ---------------------------------------------------------------- partitions


def partition_name(day: date) -> str:
    return f"{PARTITIONED_TABLE}_{day:%Y%m%d}"


def existing_partitions(conn: Connection) -> dict[str, date]:
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :parent"
        ),
        {"parent": PARTITIONED_TABLE},
    ).scalars()
    result = {}
    for name in names:
        stamp = name.rsplit("_", 1)[-1]
        result[name] = date(int(stamp[:4]), int(stamp[4:6]), int(stamp[6:]))
    return result


def ensure_partitions(conn: Connection, first: date, last: date) -> list[str]:
    """Create the daily partitions (UTC days) from FIRST to LAST that do not exist yet."""
    return ensure_day_partitions(conn, [first + timedelta(days=n) for n in range((last - first).days + 1)])


def ensure_day_partitions(conn: Connection, wanted: Iterable[date]) -> list[str]:
    """Create the daily partitions (UTC days) of the days WANTED that do not exist yet.

    Only the days asked for: a batch of windows creates the partitions of the days its
    windows are in, never every day between its first and last (the ingest boundary has
    refused windows outside the plausible range, so these are few).
    """
    days = sorted(set(wanted))
    existing = existing_partitions(conn)
    if all(partition_name(day) in existing for day in days):
        return []
    # writers of several nodes may want the same new day at once: one creates it, the others
    # wait for its commit and then see it
    advisory_xact_lock(conn, PARTITION_LOCK_KEY)
    existing = existing_partitions(conn)
    created = []
    for day in days:
        name = partition_name(day)
        # the owner's function (migration 0010) makes it: the daemon's role owns no table
        if (
            name not in existing
            and conn.execute(
                text("SELECT slurmtel_create_summary_partition(:day)"), {"day": day}
            ).scalar_one()
        ):
            created.append(name)
    return created


def drop_partitions_before(conn: Connection, cutoff: date) -> list[str]:
    """Drop the daily partitions that end on or before CUTOFF (retention)."""
    dropped = []
    for name, day in sorted(existing_partitions(conn).items(), key=lambda kv: kv[1]):
        if (
            day + timedelta(days=1) <= cutoff
            and conn.execute(text("SELECT slurmtel_drop_summary_partition(:day)"), {"day": day}).scalar_one()
        ):
            dropped.append(name)
    return dropped


# ---------------------------------------------------------------- summaries


class PartitionBudget:
    """How many daily partitions one run may still create (telemetry.max_new_partitions_per_run).

    Shared by the threads of one run (agents pulled several at a time)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._left = limit
        self._lock = threading.Lock()

    def grant(self, days: Sequence[date]) -> set[date]:
        """The DAYS (in the order given) that may get a partition; the budget shrinks by them."""
        with self._lock:
            granted = list(days[: max(self._left, 0)])
            self._left -= len(granted)
        return set(granted)


def write_summaries(
    conn: Connection,
    summaries: Sequence[GpuSummary],
    *,
    source: str,
    node: str = "",
    partition_budget: PartitionBudget | None = None,
) -> SummaryWriteStats:
    """Store window summaries once each, in the caller's transaction.

    The common case (nothing stored yet) is a plain binary COPY into the partitioned table.
    A retried pull brings rows that exist already (or a page repeats a window); then the batch
    goes through a staging table and only the new rows are inserted, the first of a repeated
    window kept. A summary that cannot be stored (a value beyond its column) is left out and
    returned in SummaryWriteStats.refused, with the field that does not fit; the rest is stored.
    Partitions are created for the days the windows are in, as far as PARTITION_BUDGET allows
    (the newest days first); the windows of a day left without one are refused too.
    """
    summaries, refused = _storable_windows(summaries)
    if summaries:
        summaries, refused_days = _within_partition_budget(conn, summaries, partition_budget)
        refused += refused_days
    if not summaries:
        return SummaryWriteStats(None, len(refused), 0, tuple(refused))
    received = len(summaries) + len(refused)
    lo = min(s.window_start_at for s in summaries)
    hi = max(s.window_start_at for s in summaries)
    batch_id = int(
        conn.execute(
            text(
                "INSERT INTO ingest_batch (source, node, window_min_at, window_max_at, rows) "
                "VALUES (:source, :node, :lo, :hi, :rows) RETURNING id"
            ),
            {"source": source, "node": node, "lo": lo, "hi": hi, "rows": len(summaries)},
        ).scalar_one()
    )
    ensure_day_partitions(conn, {_day(s) for s in summaries})
    savepoint = conn.begin_nested()
    with gc_paused():  # a row tuple per window: nothing cyclic, no need to scan the heap
        rows = summary_rows(summaries, batch_id)
    try:
        with gc_paused():
            copy_rows(conn, PARTITIONED_TABLE, _COPY_COLUMNS, rows)
        savepoint.commit()
        inserted = len(rows)
    except (UniqueViolation, IntegrityError):
        savepoint.rollback()
        inserted, failed = _insert_new_summaries(conn, rows)
        refused += [(summaries[i], _refusal(summaries[i], error)) for i, error in failed]
    except ROW_ERRORS:
        # one summary spoils the COPY of all: name it by field, store the others
        savepoint.rollback()
        kept, unfit = sort_out(summaries, SUMMARY_COLUMNS)
        refused += unfit
        with gc_paused():
            rows = summary_rows(kept, batch_id)
        inserted, failed = _insert_new_summaries(conn, rows)
        refused += [(kept[i], _refusal(kept[i], error)) for i, error in failed]
    if inserted == 0:
        conn.execute(text("DELETE FROM ingest_batch WHERE id = :id"), {"id": batch_id})
        return SummaryWriteStats(None, received, 0, tuple(refused))
    if inserted != len(summaries):
        conn.execute(
            text("UPDATE ingest_batch SET rows = :n WHERE id = :id"), {"n": inserted, "id": batch_id}
        )
    return SummaryWriteStats(batch_id, received, inserted, tuple(refused))


def _day(summary: GpuSummary) -> date:
    return summary.window_start_at.astimezone(UTC).date()


def _within_partition_budget(
    conn: Connection, summaries: list[GpuSummary], budget: PartitionBudget | None
) -> tuple[list[GpuSummary], list[tuple[GpuSummary, str]]]:
    if budget is None:
        return summaries, []
    days = {_day(s) for s in summaries}
    missing = sorted(days - set(existing_partitions(conn).values()), reverse=True)
    if not missing:
        return summaries, []
    allowed = days - set(missing) | budget.grant(missing)
    kept = [s for s in summaries if _day(s) in allowed]
    reason = (
        f"its day has no partition yet, and this run has created as many as "
        f"telemetry.max_new_partitions_per_run allows ({budget.limit})"
    )
    return kept, [(s, reason) for s in summaries if _day(s) not in allowed]


def _refusal(summary: GpuSummary, error: str) -> str:
    return record_problem(summary, SUMMARY_COLUMNS) or f"the database refused it: {error}"


def _storable_windows(
    summaries: Sequence[GpuSummary],
) -> tuple[list[GpuSummary], list[tuple[GpuSummary, str]]]:
    """The summaries whose window start can place them in a partition, and the others (a
    window start that is no aware datetime cannot be compared or given a day)."""
    kept: list[GpuSummary] = []
    refused: list[tuple[GpuSummary, str]] = []
    for summary in summaries:
        start = summary.window_start_at
        if type(start) is datetime and start.tzinfo is not None:
            kept.append(summary)
        else:
            refused.append((summary, f"window_start_at {value_problem(start, 'timestamptz')}"))
    return kept, refused


def _insert_new_summaries(
    conn: Connection, rows: Sequence[tuple[Any, ...]]
) -> tuple[int, list[tuple[int, str]]]:
    """Insert the ROWS not stored yet, through a staging table; also (index, error) of the rows
    that could not be written."""
    names = ", ".join(c for c, _ in _COPY_COLUMNS)
    conn.execute(
        text(
            f"CREATE TEMP TABLE IF NOT EXISTS summary_stage ON COMMIT DELETE ROWS "
            f"AS SELECT {names} FROM {PARTITIONED_TABLE} WITH NO DATA"
        )
    )
    conn.execute(text("TRUNCATE summary_stage"))
    failed = copy_rows_isolating(conn, "summary_stage", _COPY_COLUMNS, rows)
    result = conn.execute(
        text(
            f"INSERT INTO {PARTITIONED_TABLE} ({names}) SELECT {names} FROM summary_stage "
            "ON CONFLICT (gpu_uuid, window_start_at, source) DO NOTHING"
        )
    )
    return int(result.rowcount or 0), failed


# ---------------------------------------------------------------- events and inventory


def write_events(conn: Connection, events: Iterable[GpuEvent]) -> int:
    rows = [
        {
            "node": e.node,
            "gpu_uuid": e.gpu_uuid,
            "at": e.at,
            "kind": e.kind,
            "value": e.value,
            "detail": e.detail,
        }
        for e in events
    ]
    if not rows:
        return 0
    result = conn.execute(
        text(
            "INSERT INTO gpu_event (node, gpu_uuid, at, kind, value, detail) "
            "VALUES (:node, :gpu_uuid, :at, :kind, :value, :detail) ON CONFLICT DO NOTHING"
        ),
        rows,
    )
    return int(result.rowcount or 0)


def write_inventory(conn: Connection, inventory: Iterable[GpuInventory], *, source: str) -> int:
    rows = [
        {
            "source": source,
            "node": g.node,
            "gpu_uuid": g.gpu_uuid,
            "gpu_index": g.index,
            "model": g.model,
            "memory_total_bytes": g.memory_total_bytes,
            "minor_number": g.minor_number,
            "pci_bus_id": g.pci_bus_id,
            "driver_version": g.driver_version,
            "cuda_version": g.cuda_version,
            "vbios_version": g.vbios_version,
            "mig_mode": g.mig_mode,
            "parent_gpu_uuid": g.parent_gpu_uuid,
            "mig_profile": g.mig_profile,
            "gpu_fraction": g.gpu_fraction,
            "at": g.observed_at,
        }
        for g in inventory
    ]
    if not rows:
        return 0
    conn.execute(
        text(
            """
            INSERT INTO gpu_inventory (source, node, gpu_uuid, gpu_index, model, memory_total_bytes,
                minor_number, pci_bus_id, driver_version, cuda_version, vbios_version, mig_mode,
                parent_gpu_uuid, mig_profile, gpu_fraction, first_seen_at, last_seen_at)
            VALUES (:source, :node, :gpu_uuid, :gpu_index, :model, :memory_total_bytes, :minor_number,
                :pci_bus_id, :driver_version, :cuda_version, :vbios_version, :mig_mode,
                :parent_gpu_uuid, :mig_profile, :gpu_fraction, :at, :at)
            ON CONFLICT (node, gpu_uuid, gpu_index, driver_version, cuda_version, vbios_version, mig_profile)
            DO UPDATE SET last_seen_at = greatest(gpu_inventory.last_seen_at, EXCLUDED.last_seen_at),
                first_seen_at = least(gpu_inventory.first_seen_at, EXCLUDED.first_seen_at),
                model = EXCLUDED.model, memory_total_bytes = EXCLUDED.memory_total_bytes,
                minor_number = EXCLUDED.minor_number, pci_bus_id = EXCLUDED.pci_bus_id,
                mig_mode = EXCLUDED.mig_mode, parent_gpu_uuid = EXCLUDED.parent_gpu_uuid,
                gpu_fraction = EXCLUDED.gpu_fraction
            """
        ),
        rows,
    )
    return len(rows)


# ---------------------------------------------------------------- controller views


def write_allocations(conn: Connection, allocations: Iterable[GpuAllocation]) -> int:
    """Store live GPU allocations, translating Slurm's index to the GPU's UUID through the
    node's inventory as it was when the allocation was seen (whole GPUs only)."""
    rows = [
        {
            "cluster": a.cluster,
            "job_id_raw": a.job_id_raw,
            "submit_at": a.submit_at,
            "node": a.node,
            "gpu_index": a.gpu_index,
            "gpu_uuid": a.gpu_uuid,
            "gpu_model": a.gpu_model,
            "at": a.observed_at,
        }
        for a in allocations
    ]
    if not rows:
        return 0
    conn.execute(
        text(
            """
            INSERT INTO gpu_allocation AS g (cluster, job_id_raw, submit_at, node, gpu_index, gpu_uuid,
                gpu_model, first_seen_at, last_seen_at)
            VALUES (:cluster, :job_id_raw, :submit_at, :node, :gpu_index,
                coalesce(nullif(:gpu_uuid, ''), (
                    SELECT i.gpu_uuid FROM gpu_inventory i
                    WHERE i.node = :node AND i.gpu_index = :gpu_index AND i.parent_gpu_uuid = ''
                    ORDER BY (i.first_seen_at <= :at AND i.last_seen_at >= :at) DESC,
                             abs(extract(epoch FROM i.last_seen_at - CAST(:at AS timestamptz)))
                    LIMIT 1), ''),
                :gpu_model, :at, :at)
            ON CONFLICT (cluster, job_id_raw, submit_at, node, gpu_index) DO UPDATE
            SET last_seen_at = greatest(g.last_seen_at, EXCLUDED.last_seen_at),
                first_seen_at = least(g.first_seen_at, EXCLUDED.first_seen_at),
                gpu_uuid = CASE WHEN g.gpu_uuid = '' THEN EXCLUDED.gpu_uuid ELSE g.gpu_uuid END
            """
        ),
        rows,
    )
    return len(rows)


def resolve_allocation_uuids(conn: Connection, *, node: str | None = None) -> int:
    """Fill in UUIDs of allocations seen before their node's inventory arrived: on NODE, whose
    inventory was just written (concurrent writers of other nodes' rows never wait on each
    other), or on every node."""
    result = conn.execute(
        text(
            """
            UPDATE gpu_allocation a SET gpu_uuid = found.gpu_uuid
            FROM (
                SELECT u.cluster, u.job_id_raw, u.submit_at, u.node, u.gpu_index, (
                    SELECT i.gpu_uuid FROM gpu_inventory i
                    WHERE i.node = u.node AND i.gpu_index = u.gpu_index AND i.parent_gpu_uuid = ''
                    ORDER BY (i.first_seen_at <= u.first_seen_at AND i.last_seen_at >= u.first_seen_at) DESC,
                             abs(extract(epoch FROM i.last_seen_at - u.first_seen_at))
                    LIMIT 1) AS gpu_uuid
                FROM gpu_allocation u
                WHERE u.gpu_uuid = '' AND (CAST(:node AS text) IS NULL OR u.node = CAST(:node AS text))
            ) found
            WHERE found.gpu_uuid IS NOT NULL AND a.cluster = found.cluster AND a.job_id_raw = found.job_id_raw
              AND a.submit_at = found.submit_at AND a.node = found.node AND a.gpu_index = found.gpu_index
            """
        ),
        {"node": node},
    )
    return int(result.rowcount or 0)


def write_node_states(conn: Connection, states: Iterable[NodeState]) -> int:
    """Extend a node's current state interval, or open a new one when the state changed."""
    count = 0
    for s in states:
        current = conn.execute(
            text(
                "SELECT id, states, gpus_total, partitions, gpu_model, reason, last_seen_at FROM node_state "
                "WHERE cluster = :cluster AND node = :node ORDER BY last_seen_at DESC LIMIT 1"
            ),
            {"cluster": s.cluster, "node": s.node},
        ).first()
        same = current is not None and (
            list(current.states),
            current.gpus_total,
            list(current.partitions),
            current.gpu_model,
            current.reason,
        ) == (list(s.states), s.gpus_total, list(s.partitions), s.gpu_model, s.reason)
        if current is not None and same and current.last_seen_at <= s.observed_at:
            conn.execute(
                text("UPDATE node_state SET last_seen_at = :at, gpus_allocated = :alloc WHERE id = :id"),
                {"at": s.observed_at, "alloc": s.gpus_allocated, "id": current.id},
            )
        elif current is None or current.last_seen_at < s.observed_at:
            conn.execute(
                text(
                    "INSERT INTO node_state (cluster, node, states, gpus_total, gpus_allocated, partitions, "
                    "gpu_model, reason, first_seen_at, last_seen_at) VALUES (:cluster, :node, :states, :total, "
                    ":alloc, :partitions, :model, :reason, :at, :at)"
                ),
                {
                    "cluster": s.cluster,
                    "node": s.node,
                    "states": list(s.states),
                    "total": s.gpus_total,
                    "alloc": s.gpus_allocated,
                    "partitions": list(s.partitions),
                    "model": s.gpu_model,
                    "reason": s.reason,
                    "at": s.observed_at,
                },
            )
        count += 1
    return count


def write_pending(
    conn: Connection, pending: Iterable[PendingJob], *, cluster: str, observed_at: datetime
) -> int:
    rows = [
        {
            "cluster": p.cluster,
            "job_id_raw": p.job_id_raw,
            "submit_at": p.submit_at,
            "reason": p.reason,
            "job_id": p.job_id,
            "user": p.user,
            "account": p.account,
            "partition": p.partition,
            "gpus": p.gpus_requested,
            "eligible_at": p.eligible_at,
            "at": p.observed_at,
        }
        for p in pending
    ]
    if rows:
        conn.execute(
            text(
                """
                INSERT INTO pending_job AS p (cluster, job_id_raw, submit_at, reason, job_id, user_name, account,
                    partition, gpus_requested, eligible_at, first_seen_at, last_seen_at)
                VALUES (:cluster, :job_id_raw, :submit_at, :reason, :job_id, :user, :account, :partition,
                    :gpus, :eligible_at, :at, :at)
                ON CONFLICT (cluster, job_id_raw, submit_at, reason) DO UPDATE
                SET last_seen_at = greatest(p.last_seen_at, EXCLUDED.last_seen_at),
                    first_seen_at = least(p.first_seen_at, EXCLUDED.first_seen_at),
                    gpus_requested = EXCLUDED.gpus_requested, partition = EXCLUDED.partition
                """
            ),
            rows,
        )
    conn.execute(
        text(
            "INSERT INTO controller_snapshot (cluster, observed_at) VALUES (:cluster, :at) "
            "ON CONFLICT (cluster) DO UPDATE SET observed_at = greatest(controller_snapshot.observed_at, EXCLUDED.observed_at)"
        ),
        {"cluster": cluster, "at": observed_at},
    )
    return len(rows)


# ---------------------------------------------------------------- agent cursors


@dataclass(frozen=True)
class AgentCursor:
    node: str
    spool_id: str
    cursor: int


def get_agent_cursor(conn: Connection, node: str) -> AgentCursor | None:
    row = conn.execute(
        text("SELECT node, spool_id, cursor FROM agent_cursor WHERE node = :node"), {"node": node}
    ).first()
    return AgentCursor(row.node, row.spool_id, int(row.cursor)) if row else None


def set_agent_cursor(
    conn: Connection,
    node: str,
    *,
    spool_id: str,
    cursor: int,
    evicted_total: int,
    spool_items: int,
    spool_bytes: int,
) -> None:
    conn.execute(
        text(
            """
            INSERT INTO agent_cursor (node, spool_id, cursor, evicted_total, spool_items, spool_bytes)
            VALUES (:node, :spool_id, :cursor, :evicted, :items, :bytes)
            ON CONFLICT (node) DO UPDATE SET spool_id = EXCLUDED.spool_id, cursor = EXCLUDED.cursor,
                evicted_total = EXCLUDED.evicted_total, spool_items = EXCLUDED.spool_items,
                spool_bytes = EXCLUDED.spool_bytes, updated_at = now()
            """
        ),
        {
            "node": node,
            "spool_id": spool_id,
            "cursor": cursor,
            "evicted": evicted_total,
            "items": spool_items,
            "bytes": spool_bytes,
        },
    )
