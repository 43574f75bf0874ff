"""The sample store: where per-GPU telemetry windows are kept, behind one interface.

Two halves, and nothing else touches windows:

- **Reads** go through the SQL function `slurmtel_gpu_windows(uuids, lo, hi)` (migration
  0012): the windows of some GPUs that overlap [lo, hi), as gpu_window rows. Attribution
  (store/attribution.py) and `slurmtel job` (store/jobview.py) call it and read no table.
- **Writes and upkeep** go through `SampleStore`: the sources write windows with `write`, each
  attribution run calls `after_attribution` (the PostgreSQL store packs the closed hours it
  has folded in), the daily job calls `maintain` (partitions ahead, retention).

Another store (docs/scale.md: windows kept in the site's Prometheus-compatible store, or
gpu_window distributed by node with Citus) is another class here and another body of
`slurmtel_gpu_windows` (for a remote store: a temporary table it fills before attribution
reads it), not a change to attribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Protocol

from sqlalchemy import Connection

from slurmtel.records import GpuSummary
from slurmtel.store import telemetry
from slurmtel.store.telemetry import PartitionBudget, SummaryWriteStats


class SampleStore(Protocol):
    def write(
        self,
        conn: Connection,
        summaries: Sequence[GpuSummary],
        *,
        source: str,
        node: str = "",
        partition_budget: PartitionBudget | None = None,
    ) -> SummaryWriteStats:
        """Store each window once (a repeat is counted, not stored), in the caller's transaction,
        as one ingest batch that the next attribution run folds in."""
        ...

    def write_groups(
        self,
        conn: Connection,
        groups: Sequence[tuple[str, Sequence[GpuSummary]]],
        *,
        source: str,
        partition_budget: PartitionBudget | None = None,
    ) -> list[SummaryWriteStats]:
        """`write` for several nodes' (node, summaries) at once, in the caller's transaction: one
        ingest batch and one SummaryWriteStats each, in the order given; what one node's
        windows do (a repeat, a value that does not fit) costs the others nothing."""
        ...

    def after_attribution(self, conn: Connection, *, now: datetime) -> int:
        """Called by each attribution run, in its transaction, once it has folded in the new
        batches; returns the windows it reorganised."""
        ...

    def maintain(
        self, conn: Connection, *, first_day: date, last_day: date, cutoff: date
    ) -> tuple[list[str], list[str]]:
        """Make room for the days FIRST_DAY..LAST_DAY and drop what ends before CUTOFF (UTC days);
        (created, dropped)."""
        ...

    def size(self, conn: Connection) -> tuple[int, int]:
        """(bytes, windows) held."""
        ...


@dataclass(frozen=True)
class PostgresSampleStore:
    """Windows in PostgreSQL: one row each in gpu_window as written, one row per GPU and hour in
    gpu_window_hour once attributed (slurmtel.store.telemetry)."""

    def write(
        self,
        conn: Connection,
        summaries: Sequence[GpuSummary],
        *,
        source: str,
        node: str = "",
        partition_budget: PartitionBudget | None = None,
    ) -> SummaryWriteStats:
        return telemetry.write_summaries(
            conn, summaries, source=source, node=node, partition_budget=partition_budget
        )

    def write_groups(
        self,
        conn: Connection,
        groups: Sequence[tuple[str, Sequence[GpuSummary]]],
        *,
        source: str,
        partition_budget: PartitionBudget | None = None,
    ) -> list[SummaryWriteStats]:
        return telemetry.write_summary_groups(conn, groups, source=source, partition_budget=partition_budget)

    def after_attribution(self, conn: Connection, *, now: datetime) -> int:
        return telemetry.pack_windows(conn, now=now)

    def maintain(
        self, conn: Connection, *, first_day: date, last_day: date, cutoff: date
    ) -> tuple[list[str], list[str]]:
        return telemetry.ensure_partitions(conn, first_day, last_day), telemetry.drop_partitions_before(
            conn, cutoff
        )

    def size(self, conn: Connection) -> tuple[int, int]:
        return telemetry.window_store_size(conn)


def sample_store() -> SampleStore:
    """The store the daemon, the sources and attribution use (the one place that chooses)."""
    return PostgresSampleStore()
