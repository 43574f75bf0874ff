"""Job attempts: bulk upsert on the natural key (the newest state wins), job linking, outcome classes."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.gcpause import gc_paused
from slurmtel.records import JobAttempt
from slurmtel.store.checks import sort_out
from slurmtel.store.copy import ROW_ERRORS, copy_rows, copy_rows_isolating
from slurmtel.store.locks import WRITE_LOCK_KEY, advisory_xact_lock
from slurmtel.vocabulary import REQUEUE_STATES

# (column, PostgreSQL type for binary COPY, JobAttempt attribute) - the one column list that
# the staging table, the COPY and the upsert share. tres maps go in as dicts (jsonb), node
# tuples as text[] (store.copy dumps both).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("cluster", "text", "cluster"),
    ("job_id_raw", "int8", "job_id_raw"),
    ("submit_at", "timestamptz", "submit_at"),
    ("job_id", "text", "job_id"),
    ("name", "text", "name"),
    ("user_name", "text", "user"),
    ("uid", "int4", "uid"),
    ("account", "text", "account"),
    ("partition", "text", "partition"),
    ("qos", "text", "qos"),
    ("wckey", "text", "wckey"),
    ("state", "text", "state"),
    ("state_reason", "text", "state_reason"),
    ("exit_code", "text", "exit_code"),
    ("eligible_at", "timestamptz", "eligible_at"),
    ("start_at", "timestamptz", "start_at"),
    ("end_at", "timestamptz", "end_at"),
    ("time_limit_seconds", "int8", "time_limit_seconds"),
    ("alloc_gpus", "int4", "alloc_gpus"),
    ("alloc_cpus", "int4", "alloc_cpus"),
    ("gpu_model", "text", "gpu_model"),
    ("alloc_tres", "jsonb", "alloc_tres"),
    ("req_tres", "jsonb", "req_tres"),
    ("array_job_id", "int8", "array_job_id"),
    ("array_task_id", "int4", "array_task_id"),
    ("het_job_id", "int8", "het_job_id"),
    ("het_job_offset", "int4", "het_job_offset"),
    # unsigned 64-bit in slurmdbd (24.11+ print values beyond bigint)
    ("db_index", "numeric", "db_index"),
    ("nodelist", "text", "nodelist"),
    ("work_dir", "text", "work_dir"),
    ("submit_line", "text", "submit_line"),
    ("nodes", "text[]", "nodes"),
    ("stdout_path", "text", "stdout_path"),
    ("stdout_pattern", "text", "stdout_pattern"),
    ("cpu_time_seconds", "float8", "cpu_time_seconds"),
    ("mem_peak_task_bytes", "int8", "mem_peak_task_bytes"),
    ("mem_peak_step_bytes", "int8", "mem_peak_step_bytes"),
    ("usage_steps", "int4", "usage_steps"),
)
COLUMN_NAMES = tuple(c for c, _, _ in COLUMNS)
_ROW = attrgetter(*(attribute for _, _, attribute in COLUMNS))
KEY = ("cluster", "job_id_raw", "submit_at")
# what the attempt's steps used: a later record read without steps (sacct -X, a -P capture
# without the usage columns) does not forget it
KEEP_WHEN_NULL = ("cpu_time_seconds", "mem_peak_task_bytes", "mem_peak_step_bytes", "usage_steps")


# (column, PostgreSQL type) of the staging COPY: COLUMNS (when the view was captured is one
# value for the whole write: a parameter of the upsert, not a column of every row)
_COPY_COLUMNS = [(c, t) for c, t, _ in COLUMNS]
# (JobAttempt attribute, PostgreSQL type): what checks.record_problem checks an attempt against
ATTEMPT_FIELDS = tuple((attribute, pgtype) for _, pgtype, attribute in COLUMNS)

# States of an attempt that has not ended yet (Slurm's own; the outcome classes are the site's
# reading of the final ones). Anything else is final: the attempt ended, even without an end time.
UNFINISHED_STATES = (
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "COMPLETING",
    "CONFIGURING",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
)
_UNFINISHED = frozenset(UNFINISHED_STATES)
_EARLIEST = datetime.min.replace(tzinfo=UTC)


def progress(a: JobAttempt) -> tuple[int, datetime]:
    """How far an attempt's view has come: (0 pending, 1 running, 2 ended; its end time).

    The newest state wins: a view replaces the stored one when it has come further (an ended
    attempt never runs again, a later end never becomes an earlier one); between views that
    have come as far, the one captured later (_tie_sql).
    """
    if a.end_at is not None or a.state not in _UNFINISHED:
        return 2, a.end_at or _EARLIEST
    return (1 if a.start_at is not None else 0), _EARLIEST


def _progress_sql(row: str) -> str:
    """progress() of ROW in SQL."""
    unfinished = ", ".join(f"'{s}'" for s in UNFINISHED_STATES)
    return (
        f"(CASE WHEN {row}.end_at IS NOT NULL OR {row}.state NOT IN ({unfinished}) THEN 2 "
        f"WHEN {row}.start_at IS NOT NULL THEN 1 ELSE 0 END, coalesce({row}.end_at, '-infinity'))"
    )


def _tie_sql(captured_at: datetime | None, unknown_capture: bool) -> str:
    """Whether an incoming view replaces a stored one that has come as far."""
    if captured_at is not None:
        # a later capture (a stored row of unknown capture time is older than any known one)
        return "EXCLUDED.captured_at >= coalesce(job_attempt.captured_at, '-infinity')"
    # a saved file of unknown age never replaces an equal view; a write without a capture
    # time (a correction, the store's own callers) is the newest view there is
    return "false" if unknown_capture else "true"


def _newer_sql(captured_at: datetime | None, unknown_capture: bool) -> str:
    """Whether the incoming view (EXCLUDED) may replace the stored one (job_attempt)."""
    incoming, stored = _progress_sql("EXCLUDED"), _progress_sql("job_attempt")
    return f"({incoming} > {stored} OR ({incoming} = {stored} AND {_tie_sql(captured_at, unknown_capture)}))"


def _without_nul(row: tuple[Any, ...]) -> tuple[Any, ...]:
    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("\x00", "\ufffd")
        if isinstance(value, tuple | list):
            return type(value)(clean(v) for v in value)
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        return value

    return tuple(clean(v) for v in row)


@dataclass(frozen=True)
class WriteStats:
    received: int
    inserted: int
    updated: int
    # attempts that cannot be stored (a value beyond its column, text that is not text), with
    # the reason naming the field: the caller quarantines them (checks.rejection)
    refused: tuple[tuple[JobAttempt, str], ...] = ()
    # the natural keys (cluster, job_id_raw, submit_at) of the attempts received, less the
    # refused ones: a run of several sacct calls counts distinct attempts with them
    keys: Collection[tuple[str, int, datetime]] = ()
    # the updated attempts: natural key -> when the attempt was first stored (first_seen_at).
    # With written_at, a run tells an update of an attempt it inserted itself (in an earlier
    # sacct call: first_seen_at is that call's written_at) from a change to one stored before
    updated_keys: Mapping[tuple[str, int, datetime], datetime] = field(default_factory=dict)
    # when the write's transaction began: the first_seen_at of the attempts it inserted
    written_at: datetime | None = None

    @property
    def unchanged(self) -> int:
        return self.received - self.inserted - self.updated - len(self.refused)


def _one_per_key(attempts: Iterable[JobAttempt]) -> dict[tuple[str, int, datetime], JobAttempt]:
    """One attempt per natural key: of several views of one attempt in a batch (one capture),
    the one that has come furthest (progress), the later one of equal progress."""
    by_key: dict[tuple[str, int, datetime], JobAttempt] = {}
    for a in attempts:
        key = (a.cluster, a.job_id_raw, a.submit_at)
        known = by_key.get(key)
        if known is None or progress(a) >= progress(known):
            by_key[key] = a
    return by_key


def attempt_rows(attempts: Iterable[JobAttempt]) -> list[tuple[Any, ...]]:
    """Rows in COLUMNS order, one per natural key (of several views, the newest state)."""
    return list(map(_ROW, _one_per_key(attempts).values()))


def copy_attempt_rows(conn: Connection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Binary COPY of ROWS (in COLUMNS order) into TABLE."""
    copy_rows(conn, table, [(c, t) for c, t, _ in COLUMNS], rows)


def write_attempts(
    conn: Connection,
    attempts: Iterable[JobAttempt],
    *,
    captured_at: datetime | None = None,
    unknown_capture: bool = False,
) -> WriteStats:
    """Insert new attempts and update changed ones, in the caller's transaction.

    The newest state wins, whatever order captures arrive in: a stored view is only replaced
    by one that has come further (progress), or as far and captured no earlier. CAPTURED_AT is
    when the input was taken (a sacct call's time); without it the write is the newest view
    there is, unless UNKNOWN_CAPTURE (a saved file of unknown age: it replaces only views it
    has come further than). Idempotent: writing the same records again changes no row
    (updated_at included). An attempt that cannot be stored is left out and returned in
    WriteStats.refused.
    """
    # tens of thousands of acyclic row tuples: the cyclic collector would only rescan them
    with gc_paused():
        return _write_attempts(conn, attempts, captured_at, unknown_capture)


def _write_attempts(
    conn: Connection, attempts: Iterable[JobAttempt], captured_at: datetime | None, unknown_capture: bool
) -> WriteStats:
    by_key = _one_per_key(attempts)
    records = list(by_key.values())
    if not records:
        return WriteStats(0, 0, 0)
    # one writer of attempts at a time (the daemon and a backfill from the CLI): job linking
    # must see every attempt of a job id, and an uncommitted one of another writer it cannot
    advisory_xact_lock(conn, WRITE_LOCK_KEY)
    cols = ", ".join(COLUMN_NAMES)
    # same column types as job_attempt, no constraints; emptied at commit
    conn.execute(
        text(
            f"CREATE TEMP TABLE IF NOT EXISTS attempt_stage ON COMMIT DELETE ROWS "
            f"AS SELECT {cols} FROM job_attempt WITH NO DATA"
        )
    )
    conn.execute(text("TRUNCATE attempt_stage"))
    refused: list[tuple[JobAttempt, str]] = []
    savepoint = conn.begin_nested()
    try:
        copy_rows(conn, "attempt_stage", _COPY_COLUMNS, map(_ROW, records))
        savepoint.commit()
    except ROW_ERRORS:
        # one attempt spoils the COPY of all: keep the others. A NUL (a job name from a careless
        # script) becomes U+FFFD, so the attempt keeps its GPU time; an attempt with a value
        # no column can hold is refused by name (field, value, job)
        savepoint.rollback()
        conn.execute(text("TRUNCATE attempt_stage"))
        kept_records, refused = sort_out(records, ATTEMPT_FIELDS)
        rows = [_without_nul(_ROW(a)) for a in kept_records]
        failed = copy_rows_isolating(conn, "attempt_stage", _COPY_COLUMNS, rows)
        refused += [(kept_records[i], f"the database refused it: {error}") for i, error in failed]
    non_key = [c for c in COLUMN_NAMES if c not in KEY]

    def incoming_value(c: str) -> str:
        return f"coalesce(EXCLUDED.{c}, job_attempt.{c})" if c in KEEP_WHEN_NULL else f"EXCLUDED.{c}"

    assignments = ", ".join(f"{c} = {incoming_value(c)}" for c in non_key)
    current = ", ".join(f"job_attempt.{c}" for c in non_key)
    incoming = ", ".join(incoming_value(c) for c in non_key)
    result = conn.execute(
        text(
            f"""
            WITH written AS (
                INSERT INTO job_attempt ({cols}, captured_at, job_submit_at, attempt_number)
                SELECT {cols}, CAST(:captured_at AS timestamptz), submit_at, 1 FROM attempt_stage
                ON CONFLICT (cluster, job_id_raw, submit_at) DO UPDATE
                SET {assignments}, captured_at = EXCLUDED.captured_at, updated_at = now()
                WHERE ({current}) IS DISTINCT FROM ({incoming})
                  AND {_newer_sql(captured_at, unknown_capture)}
                RETURNING cluster, job_id_raw, submit_at, first_seen_at, (xmax = 0) AS inserted
            )
            -- the number inserted (and when: this transaction's start, their first_seen_at),
            -- then the keys of the updated ones alone: a first ingest returns one row
            SELECT NULL, NULL, NULL, now(), count(*) FROM written WHERE inserted
            UNION ALL
            SELECT cluster, job_id_raw, submit_at, first_seen_at, NULL FROM written WHERE NOT inserted
            """
        ),
        {"captured_at": captured_at},
    ).all()
    inserted = 0
    written_at: datetime | None = None
    updated_keys: dict[tuple[str, int, datetime], datetime] = {}
    for cluster, job_id_raw, submit_at, first_seen_at, count in result:
        if count is None:
            updated_keys[cluster, int(job_id_raw), submit_at] = first_seen_at
        else:
            inserted, written_at = count, first_seen_at
    if inserted or updated_keys:
        link_jobs(conn)
    # the dict itself: a set updated from a dict reuses its stored hashes (the keys' view
    # hashes every key again, 0.36 against 0.03 us an attempt)
    keys: Collection[tuple[str, int, datetime]] = by_key
    if refused:
        left_out = {id(a) for a, _ in refused}
        keys = [key for key, a in by_key.items() if id(a) not in left_out]
    return WriteStats(
        len(records), inserted, len(updated_keys), tuple(refused), keys, updated_keys, written_at
    )


def link_jobs(conn: Connection) -> None:
    """Group the attempts of the staged job ids into jobs.

    Attempts with the same (cluster, job_id_raw) belong to one job while each one follows an
    attempt that ended in a requeue state for the same user; anything else (a reused id)
    starts a new job. Sets job_submit_at (the first attempt's submit time) and attempt_number.
    A new attempt starts as its own job (attempt 1); only ids with several attempts are relinked.
    """
    # the staged ids with another attempt: one index probe each (LIMIT 1 keeps the subquery a
    # parameterized scan: a join the planner may turn into a hash join over the whole table,
    # which grows with a site's history, while the staging table has no statistics). Few ids
    # have several attempts: the relinking reads only theirs, by the ids as parameters
    ids = conn.execute(
        text(
            """
            SELECT DISTINCT s.cluster, s.job_id_raw
            FROM attempt_stage s
            CROSS JOIN LATERAL (
                SELECT 1 FROM job_attempt other
                WHERE other.cluster = s.cluster AND other.job_id_raw = s.job_id_raw
                  AND other.submit_at <> s.submit_at
                LIMIT 1
            ) sibling
            """
        )
    ).all()
    if not ids:
        return
    requeue = ", ".join(f"'{s}'" for s in REQUEUE_STATES)
    conn.execute(
        text(
            f"""
            WITH touched AS (
                SELECT * FROM unnest(CAST(:clusters AS text[]), CAST(:job_ids AS int8[])) AS t(cluster, job_id_raw)
            ),
            ordered AS (
                SELECT a.cluster, a.job_id_raw, a.submit_at,
                       CASE WHEN lag(a.state) OVER w IN ({requeue})
                                 AND lag(a.user_name) OVER w = a.user_name
                            THEN 0 ELSE 1 END AS starts_job
                FROM job_attempt a JOIN touched t USING (cluster, job_id_raw)
                WINDOW w AS (PARTITION BY a.cluster, a.job_id_raw ORDER BY a.submit_at)
            ),
            chained AS (
                SELECT *, sum(starts_job) OVER (PARTITION BY cluster, job_id_raw ORDER BY submit_at) AS chain
                FROM ordered
            ),
            keyed AS (
                SELECT cluster, job_id_raw, submit_at,
                       min(submit_at) OVER (PARTITION BY cluster, job_id_raw, chain) AS job_submit_at,
                       row_number() OVER (PARTITION BY cluster, job_id_raw, chain ORDER BY submit_at)
                           AS attempt_number
                FROM chained
            )
            UPDATE job_attempt a
            SET job_submit_at = k.job_submit_at, attempt_number = k.attempt_number, updated_at = now()
            FROM keyed k
            WHERE a.cluster = k.cluster AND a.job_id_raw = k.job_id_raw AND a.submit_at = k.submit_at
              AND (a.job_submit_at, a.attempt_number) IS DISTINCT FROM (k.job_submit_at, k.attempt_number)
            """
        ),
        {"clusters": [cluster for cluster, _ in ids], "job_ids": [job_id_raw for _, job_id_raw in ids]},
    )


def sync_outcome_classes(conn: Connection, mapping: Mapping[str, str]) -> None:
    """Make the outcome_class table equal the configured state -> class mapping."""
    rows = [{"state": s, "outcome": o} for s, o in sorted(mapping.items())]
    current = {r.state: r.outcome for r in conn.execute(text("SELECT state, outcome FROM outcome_class"))}
    if current == dict(mapping):
        return
    conn.execute(text("DELETE FROM outcome_class"))
    if rows:
        conn.execute(text("INSERT INTO outcome_class (state, outcome) VALUES (:state, :outcome)"), rows)
