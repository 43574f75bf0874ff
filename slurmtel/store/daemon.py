"""The daemon's own queries: retention of telemetry batches, and what its metrics read."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class AgentSpool:
    """What a node agent last reported about its local spool (table agent_cursor)."""

    node: str
    spool_items: int
    spool_bytes: int
    evicted_total: int
    updated_at: datetime


def delete_batches_before(conn: Connection, cutoff_at: datetime) -> int:
    """Forget ingest batches whose windows all lie before CUTOFF_AT (their partitions are gone).

    attribution_batch rows go with them (ON DELETE CASCADE); per-attempt rollups stay. Host
    batches no attribution run folded in by then go too (their windows are gone as well).
    """
    conn.execute(text("DELETE FROM host_batch WHERE window_max_at < :cutoff"), {"cutoff": cutoff_at})
    result = conn.execute(
        text("DELETE FROM ingest_batch WHERE window_max_at < :cutoff"), {"cutoff": cutoff_at}
    )
    return int(result.rowcount or 0)


def last_success_by_source(conn: Connection) -> dict[str, datetime]:
    """Per source, when its last ok or partial run finished (any mode)."""
    rows = conn.execute(
        text(
            "SELECT source, max(finished_at) FROM collect_run "
            "WHERE status IN ('ok', 'partial') AND finished_at IS NOT NULL GROUP BY source"
        )
    )
    return {source: finished for source, finished in rows}


def source_cursors(conn: Connection, source: str) -> dict[str, datetime]:
    """scope -> cursor of SOURCE (for sacct: one per cluster, 'local' without -M)."""
    rows = conn.execute(
        text("SELECT scope, cursor_at FROM source_cursor WHERE source = :source"), {"source": source}
    )
    return {scope: cursor_at for scope, cursor_at in rows}


def agent_spools(conn: Connection) -> list[AgentSpool]:
    rows = conn.execute(
        text(
            "SELECT node, spool_items, spool_bytes, evicted_total, updated_at FROM agent_cursor ORDER BY node"
        )
    )
    return [AgentSpool(*row) for row in rows]
