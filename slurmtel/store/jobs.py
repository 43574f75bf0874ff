"""Job attempts: bulk upsert on the natural key, job linking, outcome classes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from psycopg.errors import CharacterNotInRepertoire
from sqlalchemy import Connection, text
from sqlalchemy.exc import DataError

from slurmtel.parsers.slurm_common import gc_paused
from slurmtel.records import JobAttempt
from slurmtel.store.copy import copy_rows

# States an attempt ends in when Slurm runs the same job again (sacct -D shows each attempt).
REQUEUE_STATES = ("REQUEUED", "NODE_FAIL", "PREEMPTED", "REQUEUE_FED", "REQUEUE_HOLD")


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
    ("db_index", "int8", "db_index"),
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


WRITE_LOCK_KEY = 7_355_608_002  # pg_advisory_xact_lock key of attempt writes


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

    @property
    def unchanged(self) -> int:
        return self.received - self.inserted - self.updated


def attempt_rows(attempts: Iterable[JobAttempt]) -> list[tuple[Any, ...]]:
    """Rows in COLUMNS order, one per natural key (a later record of the same key wins)."""
    by_key = {(a.cluster, a.job_id_raw, a.submit_at): a for a in attempts}
    return list(map(_ROW, by_key.values()))


def copy_attempt_rows(conn: Connection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Binary COPY of ROWS (in COLUMNS order) into TABLE."""
    copy_rows(conn, table, [(c, t) for c, t, _ in COLUMNS], rows)


def write_attempts(conn: Connection, attempts: Iterable[JobAttempt]) -> WriteStats:
    """Insert new attempts and update changed ones, in the caller's transaction.

    Idempotent: writing the same records again changes no row (updated_at included).
    """
    # tens of thousands of acyclic row tuples: the cyclic collector would only rescan them
    with gc_paused():
        return _write_attempts(conn, attempts)


def _write_attempts(conn: Connection, attempts: Iterable[JobAttempt]) -> WriteStats:
    rows = attempt_rows(attempts)
    if not rows:
        return WriteStats(0, 0, 0)
    # one writer of attempts at a time (the daemon and a backfill from the CLI): job linking
    # must see every attempt of a job id, and an uncommitted one of another writer it cannot
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": WRITE_LOCK_KEY})
    cols = ", ".join(COLUMN_NAMES)
    # same column types as job_attempt, no constraints; emptied at commit
    conn.execute(
        text(
            f"CREATE TEMP TABLE IF NOT EXISTS attempt_stage ON COMMIT DELETE ROWS "
            f"AS SELECT {cols} FROM job_attempt WITH NO DATA"
        )
    )
    conn.execute(text("TRUNCATE attempt_stage"))
    savepoint = conn.begin_nested()
    try:
        copy_attempt_rows(conn, "attempt_stage", rows)
        savepoint.commit()
    except (CharacterNotInRepertoire, DataError) as exc:
        # PostgreSQL text cannot hold NUL (a job name from a careless script can): keep the
        # attempt, with U+FFFD where the NUL was, rather than lose its GPU time
        savepoint.rollback()
        if "0x00" not in str(exc):
            raise
        conn.execute(text("TRUNCATE attempt_stage"))
        copy_attempt_rows(conn, "attempt_stage", [_without_nul(row) for row in rows])
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
                INSERT INTO job_attempt ({cols}, job_submit_at, attempt_number)
                SELECT {cols}, submit_at, 1 FROM attempt_stage
                ON CONFLICT (cluster, job_id_raw, submit_at) DO UPDATE
                SET {assignments}, updated_at = now()
                WHERE ({current}) IS DISTINCT FROM ({incoming})
                RETURNING (xmax = 0) AS inserted
            )
            SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted) FROM written
            """
        )
    ).one()
    inserted, updated = int(result[0]), int(result[1])
    if inserted or updated:
        link_jobs(conn)
    return WriteStats(len(rows), inserted, updated)


def link_jobs(conn: Connection) -> None:
    """Group the attempts of the staged job ids into jobs.

    Attempts with the same (cluster, job_id_raw) belong to one job while each one follows an
    attempt that ended in a requeue state for the same user; anything else (a reused id)
    starts a new job. Sets job_submit_at (the first attempt's submit time) and attempt_number.
    A new attempt starts as its own job (attempt 1); only ids with several attempts are relinked.
    """
    requeue = ", ".join(f"'{s}'" for s in REQUEUE_STATES)
    conn.execute(
        text(
            f"""
            WITH touched AS (
                SELECT a.cluster, a.job_id_raw
                FROM job_attempt a JOIN (SELECT DISTINCT cluster, job_id_raw FROM attempt_stage) s
                     USING (cluster, job_id_raw)
                GROUP BY a.cluster, a.job_id_raw HAVING count(*) > 1
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
        )
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
