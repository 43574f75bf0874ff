"""Telemetry storage: GPU window summaries (partitioned by day, COPY, packed by the hour once
attributed), events, inventory, live GPU allocations, node states and pending jobs.

Windows are written one row each into gpu_window (binary COPY), and the attribution run packs
the closed hours it has folded in into gpu_window_hour, one row per GPU and hour holding its
windows as arrays of narrow types (migration 0012 says which). Every reader goes through the
view gpu_summary or the function slurmtel_gpu_windows (slurmtel.store.samples): the sample
store's seam.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from operator import attrgetter
from typing import Any

import orjson
from psycopg.errors import UniqueViolation
from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from slurmtel.gcpause import gc_paused
from slurmtel.records import GpuAllocation, GpuEvent, GpuInventory, GpuSummary, NodeState, PendingJob
from slurmtel.store.checks import record_problem, sort_out, value_problem
from slurmtel.store.copy import ROW_ERRORS, copy_rows, copy_rows_isolating
from slurmtel.store.locks import PARTITION_LOCK_KEY, advisory_xact_lock
from slurmtel.store.sql import Connection as ReadableConnection
from slurmtel.store.sql import text as sql_text

PARTITIONED_TABLE = "gpu_window"
# a window spans at most an hour: the window reads look back an hour for windows that began
# before their range, and attribution sums windows per hour slice (migration 0014)
MAX_WINDOW_SECONDS = 3600
PACKED_TABLE = "gpu_window_hour"


def utc_hour(expression: str) -> str:
    """SQL for the UTC hour that the timestamptz EXPRESSION falls in, whatever the session's time
    zone (date_trunc would cut India's hours at :30), without a time zone conversion."""
    return f"date_bin('1 hour', {expression}, TIMESTAMPTZ '1970-01-01 00:00+00')"


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
    batch = (batch_id,)
    return [_SUMMARY_ROW(s) + batch for s in summaries]


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


def ensure_day_partitions(
    conn: Connection, wanted: Iterable[date], *, existing: Collection[str] | None = None
) -> list[str]:
    """Create the daily partitions (UTC days) of the days WANTED that do not exist yet.

    Only the days asked for: a batch of windows creates the partitions of the days its
    windows are in, never every day between its first and last (the ingest boundary has
    refused windows outside the plausible range, so these are few). EXISTING: the partition
    names the caller read in this transaction (not read again); a day missing from it is
    looked up again under the lock.
    """
    days = sorted(set(wanted))
    if existing is None:
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

    Shared by the threads of one run (agents pulled several at a time). It counts days, not
    requests: at midnight every node's page asks for the new day, and a page stored again after
    its group failed asks again; each day costs the run one partition at most."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._granted: set[date] = set()
        self._lock = threading.Lock()

    def grant(self, days: Sequence[date]) -> set[date]:
        """The DAYS that may get a partition: those granted to this run already, and new ones
        in the order given while the budget lasts."""
        with self._lock:
            for day in days:
                if day not in self._granted and len(self._granted) < self.limit:
                    self._granted.add(day)
            return self._granted.intersection(days)


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
    (stats,) = write_summary_groups(
        conn, [(node, summaries)], source=source, partition_budget=partition_budget
    )
    return stats


def write_summary_groups(
    conn: Connection,
    groups: Sequence[tuple[str, Sequence[GpuSummary]]],
    *,
    source: str,
    partition_budget: PartitionBudget | None = None,
) -> list[SummaryWriteStats]:
    """write_summaries for several nodes' windows at once, in the caller's transaction: each
    (node, summaries) of GROUPS gets its own ingest batch (attribution reads a batch's node and
    window range) and its own SummaryWriteStats, in the order given, as if written one by one;
    but the partition list is read once, the batches are made by one INSERT, and the windows of
    all go in one binary COPY. When that COPY fails (a window stored already: a retried pull; a
    value beyond its column), or an hour of these GPUs is packed already, each group is written
    on its own as write_summaries does, in the same transaction: a repeat of one node's page
    costs nothing of another's."""
    kept_by_group: list[list[GpuSummary]] = []
    refused_by_group: list[list[tuple[GpuSummary, str]]] = []
    for _, summaries in groups:
        kept, refused = _storable_windows(summaries)
        kept_by_group.append(kept)
        refused_by_group.append(refused)
    # each group's window starts (a page's windows share a few) and their days, found once
    starts_by_group = [{s.window_start_at for s in kept} for kept in kept_by_group]
    day_of = _days(set().union(*starts_by_group))
    existing: set[str] | None = None
    if any(kept_by_group):
        existing = set(existing_partitions(conn))
        missing = {day for day in set(day_of.values()) if partition_name(day) not in existing}
        if partition_budget is not None and missing:
            for k, kept in enumerate(kept_by_group):
                if kept and any(day_of[start] in missing for start in starts_by_group[k]):
                    kept_by_group[k], refused_days = _within_partition_budget(
                        kept, partition_budget, existing, day_of
                    )
                    refused_by_group[k] += refused_days
                    starts_by_group[k] = {s.window_start_at for s in kept_by_group[k]}
    received = [
        len(kept) + len(refused) for kept, refused in zip(kept_by_group, refused_by_group, strict=True)
    ]
    stored = [(k, kept) for k, kept in enumerate(kept_by_group) if kept]
    stats = [SummaryWriteStats(None, received[k], 0, tuple(refused_by_group[k])) for k in range(len(groups))]
    if not stored:
        return stats
    bounds = [(min(starts_by_group[k]), max(starts_by_group[k])) for k, _ in stored]
    every = [s for _, kept in stored for s in kept]
    # the partitions first, before this transaction reads or writes a table they belong to:
    # their creator holds the partition lock and waits for every lock on gpu_window and
    # gpu_window_hour, so a transaction holding one while it waits for the partition lock
    # deadlocks with it
    ensure_day_partitions(
        conn, {day_of[start] for k, _ in stored for start in starts_by_group[k]}, existing=existing
    )
    batch_ids, packed = _new_batches(
        conn,
        source,
        [(groups[k][0], lo, hi, len(kept)) for (k, kept), (lo, hi) in zip(stored, bounds, strict=True)],
        every,
    )
    inserted: dict[int, int] = {}
    if not packed:
        with gc_paused():  # a row tuple per window: nothing cyclic, no need to scan the heap
            rows = [
                row
                for (_, kept), batch_id in zip(stored, batch_ids, strict=True)
                for row in summary_rows(kept, batch_id)
            ]
        savepoint = conn.begin_nested()
        try:
            with gc_paused():
                copy_rows(conn, PARTITIONED_TABLE, _COPY_COLUMNS, rows)
            savepoint.commit()
            inserted = {k: len(kept) for k, kept in stored}
        except _COPY_FAILURES:
            savepoint.rollback()
    for (k, kept), batch_id in zip(stored, batch_ids, strict=True):
        if k in inserted:
            count = inserted[k]
        else:
            # a retried pull of hours packed already or stored already; or a window that spoils
            # the COPY of all: only the windows not stored yet, each unfit one named by field
            count, refused = _insert_new_windows(conn, kept, batch_id)
            refused_by_group[k] += refused
        if count == 0:
            conn.execute(text("DELETE FROM ingest_batch WHERE id = :id"), {"id": batch_id})
            stats[k] = SummaryWriteStats(None, received[k], 0, tuple(refused_by_group[k]))
            continue
        if count != len(kept):
            conn.execute(
                text("UPDATE ingest_batch SET rows = :n WHERE id = :id"), {"n": count, "id": batch_id}
            )
        stats[k] = SummaryWriteStats(batch_id, received[k], count, tuple(refused_by_group[k]))
    return stats


# what makes write_summary_groups' COPY fail and the groups be written one by one
_COPY_FAILURES: tuple[type[BaseException], ...] = (UniqueViolation, IntegrityError, *ROW_ERRORS)


def _new_batches(
    conn: Connection,
    source: str,
    batches: Sequence[tuple[str, datetime, datetime, int]],
    summaries: Sequence[GpuSummary],
) -> tuple[list[int], bool]:
    """One ingest batch per (node, first window start, last window start, rows), by one INSERT;
    their ids in the order given, and whether any hour of these GPUs that SUMMARIES (the
    batches' windows) fall in has packed windows already: asked in the same statement, as each
    round trip of a group's transaction is a wait for the GIL on a busy head."""
    uuids = sorted(uuid for uuid in {s.gpu_uuid for s in summaries} if _plain_text(uuid))
    # the ids come from the sequence in the order the rows are inserted; each row says which it is.
    # the batches and the GPUs as JSON documents, parsed by the server: psycopg dumps a bound
    # list a value at a time in Python, and at the 60 s pull (a thousand GPUs, a hundred nodes
    # a group) those arrays cost more client CPU than the COPY (measured)
    made = conn.execute(
        text(
            f"""
            WITH made AS (
                INSERT INTO ingest_batch (source, node, window_min_at, window_max_at, rows)
                SELECT :source, u.node, u.lo, u.hi, u.rows
                FROM ROWS FROM (json_to_recordset(CAST(:batches AS json))
                                AS (node text, lo timestamptz, hi timestamptz, rows integer))
                     WITH ORDINALITY AS u(node, lo, hi, rows, k)
                ORDER BY u.k
                RETURNING id, node, window_min_at, window_max_at, rows
            )
            SELECT made.*,
                   EXISTS (SELECT 1 FROM {PACKED_TABLE}
                           WHERE gpu_uuid = ANY (ARRAY(SELECT json_array_elements_text(CAST(:uuids AS json))))
                           AND hour_at >= {utc_hour("CAST(:lo AS timestamptz)")}
                           AND hour_at <= CAST(:hi AS timestamptz)) AS packed
            FROM made
            """
        ),
        {
            "source": source,
            "batches": orjson.dumps(
                [{"node": node, "lo": lo, "hi": hi, "rows": rows} for node, lo, hi, rows in batches]
            ).decode(),
            "uuids": orjson.dumps(uuids).decode(),
            "lo": min(lo for _, lo, _, _ in batches),
            "hi": max(hi for _, _, hi, _ in batches),
        },
    ).all()
    by_key: dict[tuple[str, datetime, datetime, int], list[int]] = {}
    for row in sorted(made, key=lambda r: r.id, reverse=True):
        by_key.setdefault((row.node, row.window_min_at, row.window_max_at, row.rows), []).append(int(row.id))
    return [by_key[batch].pop() for batch in batches], any(row.packed for row in made)


def _insert_new_windows(
    conn: Connection, summaries: list[GpuSummary], batch_id: int
) -> tuple[int, list[tuple[GpuSummary, str]]]:
    """Insert those of SUMMARIES not stored yet (nor packed) as batch BATCH_ID, without COPY's
    all-or-nothing: (inserted, the refused ones with their reason)."""
    kept, refused = sort_out(summaries, SUMMARY_COLUMNS)
    with gc_paused():
        rows = summary_rows(kept, batch_id)
    inserted, failed = _insert_new_summaries(conn, rows)
    return inserted, [*refused, *((kept[i], _refusal(kept[i], error)) for i, error in failed)]


def _days(starts: Iterable[datetime]) -> dict[datetime, date]:
    """The UTC day of each window start of STARTS (distinct: many windows share a start)."""
    return {start: start.astimezone(UTC).date() for start in starts}


def _within_partition_budget(
    summaries: list[GpuSummary], budget: PartitionBudget, existing: set[str], day_of: dict[datetime, date]
) -> tuple[list[GpuSummary], list[tuple[GpuSummary, str]]]:
    """SUMMARIES whose day has a partition or gets one within BUDGET, and the others with the
    reason; DAY_OF gives each window start's day (the caller's _days)."""
    days = {day_of[s.window_start_at] for s in summaries}
    missing = sorted((day for day in days if partition_name(day) not in existing), reverse=True)
    if not missing:
        return summaries, []
    allowed = days - set(missing) | budget.grant(missing)
    kept = [s for s in summaries if day_of[s.window_start_at] in allowed]
    reason = (
        f"its day has no partition yet, and this run has created as many as "
        f"telemetry.max_new_partitions_per_run allows ({budget.limit})"
    )
    return kept, [(s, reason) for s in summaries if day_of[s.window_start_at] not in allowed]


def _refusal(summary: GpuSummary, error: str) -> str:
    return record_problem(summary, SUMMARY_COLUMNS) or f"the database refused it: {error}"


def _storable_windows(
    summaries: Sequence[GpuSummary],
) -> tuple[list[GpuSummary], list[tuple[GpuSummary, str]]]:
    """The summaries whose window start can place them in a partition, and the others (a
    window start that is no aware datetime cannot be compared or given a day; a window longer
    than MAX_WINDOW_SECONDS would be missed by the window reads and the hour slices)."""
    kept: list[GpuSummary] = []
    refused: list[tuple[GpuSummary, str]] = []
    for summary in summaries:
        start = summary.window_start_at
        length = summary.window_seconds
        if not (type(start) is datetime and start.tzinfo is not None):
            refused.append((summary, f"window_start_at {value_problem(start, 'timestamptz')}"))
        elif isinstance(length, int | float) and length > MAX_WINDOW_SECONDS:
            refused.append(
                (
                    summary,
                    f"window_seconds ({length!r}) is longer than a window may be ({MAX_WINDOW_SECONDS} s)",
                )
            )
        else:
            kept.append(summary)
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
            f"""
            INSERT INTO {PARTITIONED_TABLE} ({names}) SELECT {names} FROM summary_stage s
            WHERE NOT EXISTS (
                SELECT 1 FROM {PACKED_TABLE} h
                WHERE h.gpu_uuid = s.gpu_uuid AND h.source = s.source AND h.hour_at = {_HOUR_OF_WINDOW}
                  AND slurmtel_packed_holds(h, {_OFFSET_MS}))
            ON CONFLICT (gpu_uuid, window_start_at, source) DO NOTHING
            """
        )
    )
    return int(result.rowcount or 0), failed


def _plain_text(value: object) -> bool:
    """VALUE is text PostgreSQL takes as a parameter (the COPY names what is not)."""
    if type(value) is str and value.isascii():
        # (every GPU's UUID: the full check only for the others)
        return "\x00" not in value
    return value_problem(value, "text") is None and "\x00" not in str(value)


# ---------------------------------------------------------------- packing closed hours

_HOUR_OF_WINDOW = utc_hour("s.window_start_at")
_OFFSET_MS = f"CAST(round(extract(epoch FROM s.window_start_at - {_HOUR_OF_WINDOW}) * 1000) AS integer)"

# GPUs packed per attribution run at most: 1,000, or the cluster's GPUs over PACK_RUNS when that
# is more, so that a closed hour is packed over at most PACK_RUNS runs (40 minutes at the
# default interval) whatever the cluster's size: at 10,000 GPUs an hour of windows (1.2
# million) over 8 runs rather than in one (6 runs cost 7-8 s of CPU each there), and no window
# stays unpacked for more than about 1 h 45 min (the hour, the delay, the runs)
PACK_GPUS_PER_RUN = 1_000
PACK_RUNS = 8

# An hour is packed once it ended this long ago, by when the attribution run after its end has
# folded it in (a late window after that is merged into its packed row by a later run).
PACK_DELAY = timedelta(minutes=10)

# What the packed types hold (migration 0012); a window beyond them stays one row in
# gpu_window (nothing is lost; it just is not packed).
_INT2 = 32767


def _within(expression: str, limit: float) -> str:
    # NULL fits (arrays keep NULLs); NaN compares above every number, so it does not
    return f"coalesce(abs({expression}) <= {limit}, true)"


_FITS = " AND ".join(
    (
        "s.window_seconds > 0",
        f"CASE WHEN s.window_seconds > 0 THEN {_within('s.covered_seconds * 30000.0 / s.window_seconds', _INT2)}"
        f" AND {_within('s.idle_seconds * 30000.0 / s.window_seconds', _INT2)}"
        f" AND {_within('s.no_process_seconds * 30000.0 / s.window_seconds', _INT2)} ELSE false END",
        _within("s.util_mean_percent * 100.0", _INT2),
        _within("s.util_max_percent * 100.0", _INT2),
        _within("s.memory_used_mean_bytes / 1024.0", 2**31 - 1),
        _within("s.memory_used_max_bytes / 1024.0", 2**31 - 1),
        _within("s.power_mean_watts * 10.0", _INT2),
        _within("s.energy_joules", 3.0e38),
        _within("s.temperature_max_celsius * 10.0", _INT2),
        _within("s.sm_clock_max_mhz", _INT2),
        # job ids are joined by chr(31) inside a packed row; '' and NULL would not come back
        "NOT EXISTS (SELECT 1 FROM unnest(s.job_ids) AS j(id) WHERE j.id IS NULL OR j.id = '' "
        "OR strpos(j.id, chr(31)) > 0)",
    )
)


def _gpus_to_pack(conn: Connection, horizon: datetime, max_gpus: int) -> list[str]:
    """Up to MAX_GPUS GPUs with windows to pack (before HORIZON, folded in by an attribution
    run, fitting the packed types), oldest day first and in UUID order within a day.

    Each day is walked through its partition's key index, from one GPU with a window before
    HORIZON to the next (a GPU packed already is stepped over), and a GPU's windows are checked
    only until one can be packed: a window that cannot be packed never picks its GPU. Checking
    every window before HORIZON instead cost 2.7-3.4 s a run at 10,000 GPUs (an hour of 1.2
    million windows, checked again by each of the ten runs that pack it)."""
    gpus: list[str] = []
    days = sorted(day for day in existing_partitions(conn).values() if day <= horizon.date())
    for day in days:
        if len(gpus) >= max_gpus:
            break
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        # the day's bounds as parameters: each read is pruned to that day's partition
        gpus += conn.execute(
            text(
                f"""
                WITH RECURSIVE walk(gpu_uuid) AS (
                    (SELECT s.gpu_uuid FROM {PARTITIONED_TABLE} s
                     WHERE s.window_start_at >= :lo AND s.window_start_at < :hi
                     ORDER BY s.gpu_uuid LIMIT 1)
                    UNION ALL
                    SELECT (SELECT s.gpu_uuid FROM {PARTITIONED_TABLE} s
                            WHERE s.gpu_uuid > w.gpu_uuid AND s.window_start_at >= :lo AND s.window_start_at < :hi
                            ORDER BY s.gpu_uuid LIMIT 1)
                    FROM walk w WHERE w.gpu_uuid IS NOT NULL
                )
                SELECT w.gpu_uuid FROM walk w
                WHERE w.gpu_uuid IS NOT NULL AND EXISTS (
                    SELECT 1 FROM {PARTITIONED_TABLE} s
                    WHERE s.gpu_uuid = w.gpu_uuid AND s.window_start_at >= :lo AND s.window_start_at < :hi
                      AND {_FITS}
                      AND EXISTS (SELECT 1 FROM attribution_batch b WHERE b.batch_id = s.batch_id))
                LIMIT :gpus
                """
            ),
            {"lo": lo, "hi": min(lo + timedelta(days=1), horizon), "gpus": max_gpus - len(gpus)},
        ).scalars()
    # a GPU may have windows to pack on several days
    return sorted(set(gpus))


def pack_budget(conn: Connection, *, now: datetime) -> int:
    """The GPUs a run packs at most: PACK_GPUS_PER_RUN, or the GPUs (and MIG instances) seen in
    the day before NOW over PACK_RUNS when that is more."""
    seen = conn.execute(
        text("SELECT count(DISTINCT gpu_uuid) FROM gpu_inventory WHERE last_seen_at > :since"),
        {"since": now - timedelta(days=1)},
    ).scalar_one()
    return max(PACK_GPUS_PER_RUN, -(-int(seen) // PACK_RUNS))


def pack_windows(conn: Connection, *, now: datetime, max_gpus: int | None = None) -> int:
    """Move the windows of hours that ended PACK_DELAY before NOW, and that an attribution run
    has folded in, from gpu_window into gpu_window_hour, for at most MAX_GPUS GPUs (pack_budget
    when None; the rest in later runs); a packed row that gets late windows is rewritten with
    them. Returns the windows moved. In the caller's transaction; idempotent (a run with
    nothing to move writes nothing)."""
    horizon = datetime.fromtimestamp((now - PACK_DELAY).timestamp() // 3600 * 3600, UTC)
    gpus = _gpus_to_pack(conn, horizon, pack_budget(conn, now=now) if max_gpus is None else max_gpus)
    if not gpus:
        return 0
    columns = ", ".join(c for c, _ in _COPY_COLUMNS)
    conn.execute(
        text(
            f"CREATE TEMP TABLE IF NOT EXISTS pack_stage (LIKE {PARTITIONED_TABLE}, packed_before boolean) "
            "ON COMMIT DELETE ROWS"
        )
    )
    conn.execute(text("TRUNCATE pack_stage"))
    moved = conn.execute(
        text(
            f"""
            WITH moved AS (
                DELETE FROM {PARTITIONED_TABLE} s
                WHERE s.gpu_uuid = ANY (CAST(:gpus AS text[])) AND s.window_start_at < :horizon AND {_FITS}
                  AND EXISTS (SELECT 1 FROM attribution_batch b WHERE b.batch_id = s.batch_id)
                RETURNING s.*
            )
            INSERT INTO pack_stage ({columns}, packed_before) SELECT {columns}, false FROM moved
            """
        ),
        {"horizon": horizon, "gpus": list(gpus)},
    ).rowcount
    if not moved:
        return 0
    # the packed rows these windows belong to come back out, to be written again with them
    conn.execute(
        text(
            f"""
            WITH shapes AS (
                SELECT DISTINCT s.gpu_uuid, {_HOUR_OF_WINDOW} AS hour_at, s.source, s.node, s.window_seconds,
                       s.util_metric, s.energy_method, coalesce(s.memory_total_bytes, -1) AS memory_total_bytes
                FROM pack_stage s
            ),
            old AS (
                DELETE FROM {PACKED_TABLE} h USING shapes k
                WHERE h.gpu_uuid = k.gpu_uuid AND h.hour_at = k.hour_at AND h.source = k.source
                  AND h.node = k.node AND h.window_seconds = k.window_seconds AND h.util_metric = k.util_metric
                  AND h.energy_method = k.energy_method AND h.memory_total_bytes = k.memory_total_bytes
                RETURNING h.*
            )
            INSERT INTO pack_stage ({columns}, packed_before)
            SELECT w.*, true FROM old h
            CROSS JOIN LATERAL slurmtel_unpack_windows(CAST(ROW(h.*) AS {PACKED_TABLE})) w
            """
        )
    )
    conn.execute(
        text(
            f"""
            WITH w AS (
                SELECT DISTINCT ON (s.gpu_uuid, s.source, s.window_start_at) s.*,
                       {_HOUR_OF_WINDOW} AS hour_at, {_OFFSET_MS} AS offset_ms,
                       coalesce(s.memory_total_bytes, -1) AS memory_total,
                       array_to_string(s.job_ids, chr(31)) AS job_set
                FROM pack_stage s
                ORDER BY s.gpu_uuid, s.source, s.window_start_at, s.packed_before DESC
            ),
            placed AS (
                SELECT w.*, CAST(round(w.window_seconds * 1000) AS integer) AS window_ms,
                       min(w.offset_ms) OVER shape AS first_ms
                FROM w
                WINDOW shape AS (PARTITION BY w.gpu_uuid, w.hour_at, w.source, w.node, w.window_seconds,
                                              w.util_metric, w.energy_method, w.memory_total)
            ),
            sets AS (
                SELECT gpu_uuid, hour_at, source, node, window_seconds, util_metric, energy_method, memory_total,
                       coalesce(array_agg(DISTINCT job_set) FILTER (WHERE job_set <> ''), '{{}}') AS job_sets
                FROM w GROUP BY gpu_uuid, hour_at, source, node, window_seconds, util_metric, energy_method,
                                memory_total
            )
            INSERT INTO {PACKED_TABLE} (source, node, gpu_uuid, hour_at, window_seconds, util_metric,
                energy_method, memory_total_bytes, batch_id, job_sets, first_offset_ms, window_offsets_ms,
                sample_counts,
                covered_parts, idle_parts, no_process_parts, util_mean_centipercents, util_max_centipercents,
                memory_used_mean_kib, memory_used_max_kib, power_mean_deciwatts, energy_joules,
                temperature_max_decicelsius, sm_clock_max_mhz, job_set_numbers)
            SELECT w.source, w.node, w.gpu_uuid, w.hour_at, w.window_seconds, w.util_metric, w.energy_method,
                   w.memory_total, max(w.batch_id), k.job_sets, min(w.first_ms),
                   -- no offsets kept when the windows follow each other from the first
                   CASE WHEN bool_and(coalesce(w.window_seconds * 1000 = w.window_ms
                                               AND (w.offset_ms - w.first_ms) % nullif(w.window_ms, 0) = 0, false))
                             AND max(w.offset_ms) - min(w.first_ms) = (count(*) - 1) * min(w.window_ms)
                        THEN NULL ELSE array_agg(w.offset_ms ORDER BY w.offset_ms) END,
                   array_agg(w.sample_count ORDER BY w.offset_ms),
                   array_agg({_parts("covered_seconds")} ORDER BY w.offset_ms),
                   array_agg({_parts("idle_seconds")} ORDER BY w.offset_ms),
                   array_agg({_parts("no_process_seconds")} ORDER BY w.offset_ms),
                   array_agg({_scaled("util_mean_percent * 100", "smallint")} ORDER BY w.offset_ms),
                   array_agg({_scaled("util_max_percent * 100", "smallint")} ORDER BY w.offset_ms),
                   array_agg({_scaled("memory_used_mean_bytes / 1024.0", "integer")} ORDER BY w.offset_ms),
                   array_agg({_scaled("memory_used_max_bytes / 1024.0", "integer")} ORDER BY w.offset_ms),
                   array_agg({_scaled("power_mean_watts * 10", "smallint")} ORDER BY w.offset_ms),
                   array_agg(CAST(w.energy_joules AS real) ORDER BY w.offset_ms),
                   array_agg({_scaled("temperature_max_celsius * 10", "smallint")} ORDER BY w.offset_ms),
                   array_agg({_scaled("sm_clock_max_mhz", "smallint")} ORDER BY w.offset_ms),
                   array_agg(CAST(coalesce(array_position(k.job_sets, w.job_set), 0) AS smallint)
                             ORDER BY w.offset_ms)
            FROM placed w JOIN sets k USING (gpu_uuid, hour_at, source, node, window_seconds, util_metric,
                                      energy_method, memory_total)
            GROUP BY w.source, w.node, w.gpu_uuid, w.hour_at, w.window_seconds, w.util_metric,
                     w.energy_method, w.memory_total, k.job_sets
            """
        )
    )
    # the days this run has emptied give their partition's index pages back
    conn.execute(
        text(
            """
            SELECT slurmtel_reclaim_window_partition(d.day)
            FROM (SELECT DISTINCT CAST(s.window_start_at AT TIME ZONE 'UTC' AS date) AS day
                  FROM pack_stage s WHERE NOT s.packed_before) d
            WHERE d.day < CAST(CAST(:horizon AS timestamptz) AT TIME ZONE 'UTC' AS date)
            """
        ),
        {"horizon": horizon},
    )
    return int(moved)


def _scaled(expression: str, pgtype: str) -> str:
    return f"CAST(round(CAST(w.{expression} AS double precision)) AS {pgtype})"


def _parts(column: str) -> str:
    return _scaled(f"{column} * 30000.0 / w.window_seconds", "smallint")


def window_store_size(conn: Connection) -> tuple[int, int]:
    """(bytes on disk, windows) of the window store: both tables' partitions, indexes and TOAST
    included. Run VACUUM first for a figure without dead rows."""
    size, windows = conn.execute(
        text(
            f"""
            SELECT (SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i
                    WHERE i.inhparent IN (CAST('{PARTITIONED_TABLE}' AS regclass), CAST('{PACKED_TABLE}' AS regclass))),
                   (SELECT count(*) FROM {PARTITIONED_TABLE})
                   + (SELECT coalesce(sum(cardinality(sample_counts)), 0) FROM {PACKED_TABLE})
            """
        )
    ).one()
    return int(size), int(windows)


# ---------------------------------------------------------------- windows read from elsewhere


def record_batches(
    conn: Connection, spans: Sequence[tuple[str, datetime, datetime, int]], *, source: str
) -> list[int]:
    """Ingest batches without windows (the windows stay in the site's store: samples.py), one
    per (node, first, last, rows) of SPANS, by one INSERT (_new_batches, with no GPU to ask
    about): each node's windows starting FIRST..LAST are there now, for the next attribution run
    to fold in. Their ids, in order."""
    if not spans:
        return []
    return _new_batches(conn, source, spans, ())[0]


def batch_spans(conn: Connection, batch_ids: Sequence[int]) -> list[tuple[int, str, datetime, datetime]]:
    """(id, node, first window start, last window start) of each batch of BATCH_IDS that has windows."""
    return [
        (int(r.id), r.node, r.window_min_at, r.window_max_at)
        for r in conn.execute(
            text(
                "SELECT id, node, window_min_at, window_max_at FROM ingest_batch "
                "WHERE id = ANY (CAST(:ids AS bigint[])) AND window_min_at IS NOT NULL ORDER BY id"
            ),
            {"ids": list(batch_ids)},
        )
    ]


def ensure_shadow_tables(conn: ReadableConnection) -> int:
    """A temporary table gpu_window, shaped as the real one and dropped when the transaction
    ends; returns its oid (each transaction that fetches windows creates its own, so the oid
    tells one transaction's table from another's). A session's temporary tables come first in
    its search path, so until then every statement that names gpu_window,
    slurmtel_gpu_windows and slurmtel_batch_windows among them, reads this one: the windows a
    remote store fetched. (Their other half, the packed hours of gpu_window_hour, is empty with
    such a store: it packs nothing.)"""
    lookup = sql_text("SELECT CAST(to_regclass('pg_temp.gpu_window') AS oid)")
    oid = conn.execute(lookup).scalar_one()
    if oid:
        return int(oid)
    conn.execute(
        sql_text(
            f"CREATE TEMP TABLE {PARTITIONED_TABLE} (LIKE {PARTITIONED_TABLE} INCLUDING DEFAULTS) ON COMMIT DROP"
        )
    )
    # the real table's lookups: attribution reads each GPU's windows by uuid and time, and the new
    # batches' windows by batch (without them every such read scans all the windows fetched:
    # 1,000 GPUs x 1 hour from VictoriaMetrics took 34 s a run, 21 s of it PostgreSQL's)
    conn.execute(sql_text(f"CREATE INDEX ON {PARTITIONED_TABLE} (gpu_uuid, window_start_at)"))
    conn.execute(sql_text(f"CREATE INDEX ON {PARTITIONED_TABLE} (batch_id)"))
    # a plan prepared earlier in this session (psycopg prepares statements it runs often) has
    # the real tables resolved in it: plan again, so that it reads these
    conn.execute(sql_text("DISCARD PLANS"))
    return int(conn.execute(lookup).scalar_one())


def load_shadow_windows(conn: ReadableConnection, windows: Sequence[tuple[GpuSummary, int | None]]) -> int:
    """Copy WINDOWS (each with its ingest batch, None: none) into the temporary gpu_window, on
    a SQLAlchemy connection or a read command's ReadConnection; returns the windows copied. A
    window that the PostgreSQL store would refuse (a value beyond its column) is left out, as
    that store leaves it out: one COPY when all fit, else the fitting ones only. The caller
    has made the table (ensure_shadow_tables, once per read: a read loads it query by query)."""
    if not windows:
        return 0
    conn.execute(sql_text("SAVEPOINT slurmtel_shadow_copy"))
    try:
        rows = [(*_SUMMARY_ROW(w), batch or 0) for w, batch in windows]
        copy_rows(conn, PARTITIONED_TABLE, _COPY_COLUMNS, rows)  # type: ignore[arg-type]
    except ROW_ERRORS:
        conn.execute(sql_text("ROLLBACK TO SAVEPOINT slurmtel_shadow_copy"))
        fitting = [(w, batch) for w, batch in windows if record_problem(w, SUMMARY_COLUMNS) is None]
        rows = [(*_SUMMARY_ROW(w), batch or 0) for w, batch in fitting]
        copy_rows(conn, PARTITIONED_TABLE, _COPY_COLUMNS, rows)  # type: ignore[arg-type]
    conn.execute(sql_text("RELEASE SAVEPOINT slurmtel_shadow_copy"))
    return len(rows)


def analyze_shadow_tables(conn: ReadableConnection) -> None:
    """Statistics of the temporary gpu_window once a read has loaded it (autovacuum never
    analyzes a temporary table: the planner would guess its size). Once per read, not per load:
    a first run loads it in thousands of pieces."""
    conn.execute(sql_text(f"ANALYZE {PARTITIONED_TABLE}"))


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
    """Upsert INVENTORY (one row per GPU configuration, first and last seen) by one statement:
    a node's first page, or every node's at a daemon's start, holds thousands. A configuration
    given twice is merged first, as the statement may touch a row once: to what upserting them
    one by one leaves (the attributes of the last, the earliest and latest time seen)."""
    merged: dict[tuple[Any, ...], tuple[datetime, datetime, GpuInventory]] = {}
    given = 0
    for g in inventory:
        given += 1
        key = (g.node, g.gpu_uuid, g.index, g.driver_version, g.cuda_version, g.vbios_version, g.mig_profile)
        seen = merged.get(key)
        if seen is None:
            merged[key] = (g.observed_at, g.observed_at, g)
        else:
            merged[key] = (min(seen[0], g.observed_at), max(seen[1], g.observed_at), g)
    if not merged:
        return 0
    # one JSON document, parsed by the server: binding sixteen arrays of thousands of values
    # cost a node's first pull a fifth of its time in psycopg's list dumping (measured)
    rows = orjson.dumps(
        [
            {
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
                # as text: JSON has no NaN or infinity, which a float column takes
                "gpu_fraction": None if g.gpu_fraction is None else str(float(g.gpu_fraction)),
                "power_limit_watts": None if g.power_limit_watts is None else str(float(g.power_limit_watts)),
                "first_seen_at": first,
                "last_seen_at": last,
            }
            for first, last, g in merged.values()
        ]
    ).decode()
    conn.execute(
        text(
            """
            INSERT INTO gpu_inventory (source, node, gpu_uuid, gpu_index, model, memory_total_bytes,
                minor_number, pci_bus_id, driver_version, cuda_version, vbios_version, mig_mode,
                parent_gpu_uuid, mig_profile, gpu_fraction, power_limit_watts, first_seen_at, last_seen_at)
            SELECT :source, node, gpu_uuid, gpu_index, model, memory_total_bytes, minor_number,
                   pci_bus_id, driver_version, cuda_version, vbios_version, mig_mode,
                   parent_gpu_uuid, mig_profile, CAST(CAST(gpu_fraction AS float8) AS real),
                   CAST(CAST(power_limit_watts AS float8) AS real), first_seen_at, last_seen_at
            FROM json_to_recordset(CAST(:rows AS json)) AS u(
                node text, gpu_uuid text, gpu_index integer, model text, memory_total_bytes bigint,
                minor_number integer, pci_bus_id text, driver_version text, cuda_version text,
                vbios_version text, mig_mode text, parent_gpu_uuid text, mig_profile text,
                gpu_fraction text, power_limit_watts text, first_seen_at timestamptz, last_seen_at timestamptz)
            ON CONFLICT (node, gpu_uuid, gpu_index, driver_version, cuda_version, vbios_version, mig_profile)
            DO UPDATE SET last_seen_at = greatest(gpu_inventory.last_seen_at, EXCLUDED.last_seen_at),
                first_seen_at = least(gpu_inventory.first_seen_at, EXCLUDED.first_seen_at),
                model = EXCLUDED.model, memory_total_bytes = EXCLUDED.memory_total_bytes,
                minor_number = EXCLUDED.minor_number, pci_bus_id = EXCLUDED.pci_bus_id,
                mig_mode = EXCLUDED.mig_mode, parent_gpu_uuid = EXCLUDED.parent_gpu_uuid,
                gpu_fraction = EXCLUDED.gpu_fraction,
                -- a source that does not know the cap keeps the one another gave
                power_limit_watts = coalesce(EXCLUDED.power_limit_watts, gpu_inventory.power_limit_watts)
            """
        ),
        {"source": source, "rows": rows},
    )
    return given


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


def resolve_allocation_uuids(conn: Connection, *, nodes: Sequence[str] | None = None) -> int:
    """Fill in UUIDs of allocations seen before their node's inventory arrived: on NODES, whose
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
                WHERE u.gpu_uuid = ''
                  AND (CAST(:nodes AS text[]) IS NULL OR u.node = ANY (CAST(:nodes AS text[])))
            ) found
            WHERE found.gpu_uuid IS NOT NULL AND a.cluster = found.cluster AND a.job_id_raw = found.job_id_raw
              AND a.submit_at = found.submit_at AND a.node = found.node AND a.gpu_index = found.gpu_index
            """
        ),
        {"nodes": None if nodes is None else list(nodes)},
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


def get_agent_cursors(conn: Connection, nodes: Sequence[str]) -> dict[str, AgentCursor]:
    """The stored cursors of NODES (those that have one), by one query."""
    rows = conn.execute(
        text("SELECT node, spool_id, cursor FROM agent_cursor WHERE node = ANY (CAST(:nodes AS text[]))"),
        {"nodes": list(nodes)},
    )
    return {row.node: AgentCursor(row.node, row.spool_id, int(row.cursor)) for row in rows}


@dataclass(frozen=True)
class AgentCursorUpdate:
    node: str
    spool_id: str
    cursor: int
    evicted_total: int
    spool_items: int
    spool_bytes: int


def set_agent_cursors(conn: Connection, updates: Sequence[AgentCursorUpdate]) -> None:
    """Store the cursors (and the spool figures the agents sent with them) of several nodes, by one
    statement."""
    if not updates:
        return
    # one JSON document, parsed by the server: psycopg dumps bound lists a value at a time
    rows = orjson.dumps(
        [
            {
                "node": u.node,
                "spool_id": u.spool_id,
                "cursor": u.cursor,
                "evicted_total": u.evicted_total,
                "spool_items": u.spool_items,
                "spool_bytes": u.spool_bytes,
            }
            for u in updates
        ]
    ).decode()
    conn.execute(
        text(
            """
            INSERT INTO agent_cursor (node, spool_id, cursor, evicted_total, spool_items, spool_bytes)
            SELECT * FROM json_to_recordset(CAST(:rows AS json))
                AS u(node text, spool_id text, cursor bigint, evicted_total bigint, spool_items bigint,
                     spool_bytes bigint)
            ON CONFLICT (node) DO UPDATE SET spool_id = EXCLUDED.spool_id, cursor = EXCLUDED.cursor,
                evicted_total = EXCLUDED.evicted_total, spool_items = EXCLUDED.spool_items,
                spool_bytes = EXCLUDED.spool_bytes, updated_at = now()
            """
        ),
        {"rows": rows},
    )
