"""The sample store: where per-GPU telemetry windows are kept, behind one interface.

Two halves, and nothing else touches windows:

- **Reads** go through the SQL function `slurmtel_gpu_windows(uuids, lo, hi)` (migration
  0012): the windows of some GPUs that overlap [lo, hi), as gpu_window rows. Attribution
  (store/attribution.py) and `slurmtel job` (store/jobview.py) call it and read no table.
- **Writes and upkeep** go through `SampleStore`: the sources write windows with `write`, each
  attribution run calls `after_attribution` (the PostgreSQL store packs the closed hours it
  has folded in), the daily job calls `maintain` (partitions ahead, retention).

Two stores (`telemetry.sample_store`, chosen by sample_store()):

- `PostgresSampleStore`: the windows in PostgreSQL (gpu_window, packed into gpu_window_hour).
- `PrometheusSampleStore`: the windows stay in the site's Prometheus-compatible server
  (Prometheus, VictoriaMetrics, Thanos, Mimir: docs/scale.md). The prometheus source records
  what it saw (the inventory, and an ingest batch per node and stretch of time: what is new for
  attribution) and stores no window. When attribution or `slurmtel job` needs windows, the
  store reads them with query_range (slurmtel.sources.promapi.WindowReader) into a temporary
  table named gpu_window, dropped at commit. PostgreSQL searches a session's temporary tables
  first, so inside that transaction the two SQL functions read it (and the real
  gpu_window_hour, empty: this store packs nothing): the same functions, attribution and the
  job view unchanged.

The `prepare_*` calls say which windows a transaction is about to read: the PostgreSQL store
has them all and does nothing; the Prometheus store fetches them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from slurmtel.config import Config
    from slurmtel.records import GpuSummary
    from slurmtel.store.sql import Connection as ReadableConnection
    from slurmtel.store.telemetry import PartitionBudget, SummaryWriteStats

# (the store's modules are imported where they are used: the job view imports this module on
# the read commands' path, which stays clear of SQLAlchemy: issue 12)


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

    def prepare_batches(self, conn: Connection, batch_ids: Sequence[int], *, now: datetime) -> int:
        """Before attribution reads the windows of these ingest batches (the job ids on each
        GPU, slurmtel_batch_windows); returns the windows fetched."""
        ...

    def prepare_attempts(self, conn: Connection, *, now: datetime) -> int:
        """Before attribution reads the windows of the attempts in dirty_attempt (those of
        their mapped nodes from the hour of from_at on, or from their start); returns the
        windows fetched."""
        ...

    def prepare_spans(
        self,
        conn: ReadableConnection,
        spans: Sequence[tuple[Sequence[str], datetime, datetime]],
        *,
        now: datetime,
    ) -> int:
        """Before the job view reads the windows of these (nodes, start, end) spans; returns the
        windows fetched."""
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
        from slurmtel.store import telemetry

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
        from slurmtel.store import telemetry

        return telemetry.write_summary_groups(conn, groups, source=source, partition_budget=partition_budget)

    def after_attribution(self, conn: Connection, *, now: datetime) -> int:
        from slurmtel.store import telemetry

        return telemetry.pack_windows(conn, now=now)

    def maintain(
        self, conn: Connection, *, first_day: date, last_day: date, cutoff: date
    ) -> tuple[list[str], list[str]]:
        from slurmtel.store import telemetry

        return telemetry.ensure_partitions(conn, first_day, last_day), telemetry.drop_partitions_before(
            conn, cutoff
        )

    def size(self, conn: Connection) -> tuple[int, int]:
        from slurmtel.store import telemetry

        return telemetry.window_store_size(conn)

    def prepare_batches(self, conn: Connection, batch_ids: Sequence[int], *, now: datetime) -> int:
        return 0

    def prepare_attempts(self, conn: Connection, *, now: datetime) -> int:
        return 0

    def prepare_spans(
        self,
        conn: ReadableConnection,
        spans: Sequence[tuple[Sequence[str], datetime, datetime]],
        *,
        now: datetime,
    ) -> int:
        return 0


class ReadWindows(Protocol):
    def __call__(
        self, nodes: Sequence[str], first: datetime, last: datetime, *, now: datetime
    ) -> Iterable[list[GpuSummary]]:
        """The windows of NODES starting FIRST..LAST (multiples of the step), as the source
        would have stored them, in pieces (each loaded before the next is read)."""
        ...


# (node, first window start, last window start)
Span = tuple[str, datetime, datetime]


@dataclass
class PrometheusSampleStore:
    """Windows kept in the site's Prometheus-compatible server, read when needed (see above).

    READ fetches windows of STEP_SECONDS; FETCHED counts the windows read so far (benchmarks)."""

    read: ReadWindows
    step_seconds: int
    fetched: int = 0
    # what this transaction's temporary table holds already: (its oid, per node the [first,
    # last] window starts fetched); a later read in the same transaction leaves them out
    _held: tuple[int, dict[str, list[tuple[datetime, datetime]]]] | None = None

    def write(
        self,
        conn: Connection,
        summaries: Sequence[GpuSummary],
        *,
        source: str,
        node: str = "",
        partition_budget: PartitionBudget | None = None,
    ) -> SummaryWriteStats:
        (stats,) = self.write_groups(
            conn, [(node, summaries)], source=source, partition_budget=partition_budget
        )
        return stats

    def write_groups(
        self,
        conn: Connection,
        groups: Sequence[tuple[str, Sequence[GpuSummary]]],
        *,
        source: str,
        partition_budget: PartitionBudget | None = None,
    ) -> list[SummaryWriteStats]:
        """No window is stored: each node's batch records that its windows from the first to the
        last start are in the server now (what attribution folds in next)."""
        from slurmtel.store import telemetry
        from slurmtel.store.telemetry import SummaryWriteStats

        spans = [
            (
                node,
                min(s.window_start_at for s in summaries),
                max(s.window_start_at for s in summaries),
                len(summaries),
            )
            for node, summaries in groups
            if summaries
        ]
        ids = iter(telemetry.record_batches(conn, spans, source=source))
        return [
            SummaryWriteStats(next(ids), len(summaries), len(summaries))
            if summaries
            else SummaryWriteStats(None, 0, 0)
            for _, summaries in groups
        ]

    def after_attribution(self, conn: Connection, *, now: datetime) -> int:
        return 0

    def maintain(
        self, conn: Connection, *, first_day: date, last_day: date, cutoff: date
    ) -> tuple[list[str], list[str]]:
        # the (empty) partitions of gpu_window are kept as the schema has them: cheap, and a
        # site can go back to the PostgreSQL store
        return PostgresSampleStore().maintain(conn, first_day=first_day, last_day=last_day, cutoff=cutoff)

    def size(self, conn: Connection) -> tuple[int, int]:
        from slurmtel.store import telemetry

        return telemetry.window_store_size(conn)

    def prepare_batches(self, conn: Connection, batch_ids: Sequence[int], *, now: datetime) -> int:
        from slurmtel.store import telemetry

        if not batch_ids:
            return 0
        batches = telemetry.batch_spans(conn, batch_ids)
        by_span: dict[tuple[datetime, datetime], list[tuple[str, int]]] = {}
        for batch_id, node, first, last in batches:
            by_span.setdefault((first, last), []).append((node, batch_id))
        fetched = 0
        held = self._held_spans(telemetry.ensure_shadow_tables(conn))
        for (first, last), members in by_span.items():
            ids = dict(members)
            for windows in self.read(sorted(ids), first, last, now=now):
                fetched += telemetry.load_shadow_windows(
                    conn, [(w, ids[w.node]) for w in windows if w.node in ids]
                )
            for node in ids:
                held.setdefault(node, []).append((first, last))
        telemetry.analyze_shadow_tables(conn)
        self.fetched += fetched
        return fetched

    def _held_spans(self, oid: int) -> dict[str, list[tuple[datetime, datetime]]]:
        """The spans fetched into the temporary table OID (this transaction's: none in another's)."""
        if self._held is None or self._held[0] != oid:
            self._held = (oid, {})
        return self._held[1]

    def prepare_attempts(self, conn: Connection, *, now: datetime) -> int:
        from slurmtel.store.attribution import dirty_attempt_spans

        return self._load(conn, dirty_attempt_spans(conn), now=now)

    def prepare_spans(
        self,
        conn: ReadableConnection,
        spans: Sequence[tuple[Sequence[str], datetime, datetime]],
        *,
        now: datetime,
    ) -> int:
        return self._load(conn, [(node, lo, hi) for nodes, lo, hi in spans for node in nodes], now=now)

    def _load(self, conn: ReadableConnection, spans: Sequence[Span], *, now: datetime) -> int:
        """Fetch the windows overlapping each (node, lo, hi) of SPANS into the temporary tables:
        a node's overlapping spans merged, nodes with the same span read together."""
        from slurmtel.store import telemetry

        step = timedelta(seconds=self.step_seconds)
        merged: dict[str, list[list[datetime]]] = {}
        for node, lo, hi in sorted(spans, key=lambda span: (span[0], span[1])):
            # the windows [t, t + step) that overlap [lo, hi): t from lo's window to the last before hi
            first, last = _floor(lo, step), _floor(hi - timedelta(microseconds=1), step)
            if last < first:
                continue
            runs = merged.setdefault(node, [])
            if runs and first <= runs[-1][1] + step:
                runs[-1][1] = max(runs[-1][1], last)
            else:
                runs.append([first, last])
        held = self._held_spans(telemetry.ensure_shadow_tables(conn))
        by_span: dict[tuple[datetime, datetime], list[str]] = {}
        for node, runs in merged.items():
            for first, last in runs:
                # the windows this transaction fetched already (the new batches') are not read again
                for piece in _without(first, last, held.get(node, ()), step):
                    by_span.setdefault(piece, []).append(node)
        fetched = 0
        for (first, last), nodes in sorted(by_span.items()):
            for windows in self.read(nodes, first, last, now=now):
                fetched += telemetry.load_shadow_windows(conn, [(w, None) for w in windows])
            for node in nodes:
                held.setdefault(node, []).append((first, last))
        telemetry.analyze_shadow_tables(conn)
        self.fetched += fetched
        return fetched


def _without(
    first: datetime, last: datetime, held: Sequence[tuple[datetime, datetime]], step: timedelta
) -> list[tuple[datetime, datetime]]:
    """The window starts FIRST..LAST (a grid of STEP) less the spans HELD, as [first, last] pieces."""
    pieces = [(first, last)]
    for lo, hi in held:
        rest = []
        for a, b in pieces:
            if hi < a or lo > b:
                rest.append((a, b))
                continue
            if lo > a:
                rest.append((a, _floor(lo - timedelta(microseconds=1), step)))
            if hi < b:
                rest.append((_floor(hi, step) + step, b))
        pieces = [(a, b) for a, b in rest if a <= b]
    return pieces


def _floor(at: datetime, step: timedelta) -> datetime:
    seconds = int(step.total_seconds())
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, at.tzinfo)


def power_max_sql(uuid: str, lo: str, hi: str, within: tuple[str, str] | None = None) -> str:
    """SQL for the highest window mean power of GPU UUID among its windows that overlap [LO, HI)
    (SQL expressions), as max(power_mean_watts) over slurmtel_gpu_windows(ARRAY[UUID], LO, HI)
    gives it (NULL: none), but reading of the packed hours only what can decide it: of an hour
    that lies inside [LO, HI) whole, its highest power (power_max_deciwatts, migration 0026);
    of an hour at an edge, the windows with their offsets, and only when the hour holds more
    than the recent windows and the whole hours do (a window of it can raise the figure only
    then). Unpacking every window of a job's hours was most of `slurmtel job`'s SQL (issue 28).

    WITHIN, two parameters (no expression: PostgreSQL leaves partitions out while planning only
    for a comparison with a constant), says that every window read starts in [WITHIN): LO - 2
    hours or before, to HI or after. Without it, planning the reads looks at every daily
    partition of the two tables: 29 ms of a 33 ms `slurmtel job` with 62 days kept."""
    if within is None:
        w_window = w_hour = ""
    else:
        w_window = f" AND pm_w.window_start_at >= {within[0]} AND pm_w.window_start_at < {within[1]}"
        w_hour = f" AND pm_h.hour_at >= {within[0]} AND pm_h.hour_at < {within[1]}"
    return f"""(SELECT greatest(pm_a.watts, pm_b.watts,
        (SELECT CAST(max(pm_p.power) / 10.0 AS real)
         FROM gpu_window_hour pm_h
         CROSS JOIN LATERAL unnest(pm_h.window_offsets_ms, pm_h.power_mean_deciwatts) WITH ORDINALITY AS pm_p(offset_ms, power, n)
         CROSS JOIN LATERAL (
             SELECT pm_h.hour_at + coalesce(pm_p.offset_ms, pm_h.first_offset_ms
                                         + (pm_p.n - 1) * CAST(round(pm_h.window_seconds * 1000) AS integer))
                                * interval '1 millisecond' AS start_at
         ) pm_t
         WHERE pm_h.gpu_uuid = {uuid} AND pm_h.hour_at > {lo} - interval '2 hours' AND pm_h.hour_at < {hi}{w_hour}
           AND NOT (pm_h.hour_at >= {lo} AND pm_h.hour_at + interval '1 hour' <= {hi})
           -- a window of an hour before LO's reaches past LO only if the hour's last can
           AND pm_h.hour_at + interval '1 hour' + make_interval(secs => pm_h.window_seconds) > {lo}
           -- its windows cannot raise the figure when it holds no more than the rest
           AND NOT coalesce(CAST(pm_h.power_max_deciwatts / 10.0 AS real) <= greatest(pm_a.watts, pm_b.watts), false)
           AND pm_t.start_at >= {lo} - interval '1 hour' AND pm_t.start_at < {hi}
           AND pm_t.start_at + make_interval(secs => pm_h.window_seconds) > {lo}))
     FROM (SELECT max(pm_w.power_mean_watts) FROM gpu_window pm_w
           WHERE pm_w.gpu_uuid = {uuid} AND pm_w.window_start_at >= {lo} - interval '1 hour'
             AND pm_w.window_start_at < {hi}
             AND pm_w.window_start_at + make_interval(secs => pm_w.window_seconds) > {lo}{w_window}) AS pm_a(watts),
          (SELECT CAST(max(pm_h.power_max_deciwatts) / 10.0 AS real) FROM gpu_window_hour pm_h
           WHERE pm_h.gpu_uuid = {uuid} AND pm_h.hour_at >= {lo} AND pm_h.hour_at + interval '1 hour' <= {hi}{w_hour})
           AS pm_b(watts))"""


def sample_store(config: Config | None = None) -> SampleStore:
    """The store the daemon, the sources, attribution and the job view use (the one place that
    chooses): `telemetry.sample_store` of CONFIG (PostgreSQL without one)."""

    if config is None or config.telemetry.sample_store == "postgresql":
        return PostgresSampleStore()
    from slurmtel.sources.promapi import WindowReader

    return PrometheusSampleStore(WindowReader(config), config.sources.prometheus.step_seconds)
