"""Collect runs (one row per run of a source) and per-source cursors.

A run in progress holds a session-level PostgreSQL advisory lock keyed by its id, taken in
the transaction that records it (so no other session ever sees the row 'running' without
its lock held). When the process dies (kill -9, a lost host), its session ends and the lock
with it: the next run that starts anywhere, on any host, marks every 'running' run whose
lock nobody holds as 'interrupted' (mark_interrupted_runs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from slurmtel.store.text import storable_text

# first key of pg_advisory_lock(namespace, run id) that each running run holds
RUN_LOCK_NAMESPACE = 7_355_608
_RUN_LOCK_KEY = "CAST(id % 2147483648 AS int4)"
INTERRUPTED_MESSAGE = (
    "interrupted: the process running it ended (killed, or it lost its database connection) "
    "before it could record the end"
)


@dataclass(frozen=True)
class CollectRun:
    id: int
    source: str
    mode: str
    started_at: datetime
    finished_at: datetime | None
    status: str
    error_kind: str
    message: str
    rows_read: int
    rows_written: int
    rows_quarantined: int


class RunLock:
    """The connection whose session holds a running run's advisory lock, until release()."""

    def __init__(self, conn: Connection, run_id: int) -> None:
        self.conn = conn
        self.run_id = run_id

    def release(self) -> None:
        try:
            self.conn.execute(
                text(f"SELECT pg_advisory_unlock(:ns, {_RUN_LOCK_KEY}) FROM (SELECT :id AS id) r"),
                {"ns": RUN_LOCK_NAMESPACE, "id": self.run_id},
            )
            self.conn.commit()
        except SQLAlchemyError:
            # the session may still hold the lock: never hand it back to the pool
            with contextlib.suppress(SQLAlchemyError):
                self.conn.invalidate()
        finally:
            with contextlib.suppress(SQLAlchemyError):
                self.conn.close()


def start_run(engine: Engine, source: str, mode: str, started_at: datetime) -> RunLock:
    """Record a run as 'running', holding its lock (release it after finish_run)."""
    conn = engine.connect()
    try:
        with conn.begin():
            run_id = int(
                conn.execute(
                    text(
                        "INSERT INTO collect_run (source, mode, started_at, status) "
                        "VALUES (:source, :mode, :started_at, 'running') RETURNING id"
                    ),
                    {"source": source, "mode": mode, "started_at": started_at},
                ).scalar_one()
            )
            # taken before the row is committed: nobody can see it running without the lock
            conn.execute(
                text(f"SELECT pg_advisory_lock(:ns, {_RUN_LOCK_KEY}) FROM (SELECT :id AS id) r"),
                {"ns": RUN_LOCK_NAMESPACE, "id": run_id},
            )
    except BaseException:
        conn.close()
        raise
    return RunLock(conn, run_id)


def mark_interrupted_runs(engine: Engine) -> list[int]:
    """Mark 'running' runs whose lock nobody holds (their process is gone) 'interrupted'."""
    with engine.begin() as conn:
        ids = conn.execute(
            text(
                f"""
                WITH running AS MATERIALIZED (SELECT id FROM collect_run WHERE status = 'running'),
                orphaned AS MATERIALIZED (
                    SELECT id FROM running WHERE pg_try_advisory_xact_lock(:ns, {_RUN_LOCK_KEY})
                )
                UPDATE collect_run c SET status = 'interrupted',
                    message = :message
                FROM orphaned o WHERE c.id = o.id AND c.status = 'running'
                RETURNING c.id
                """
            ),
            {"ns": RUN_LOCK_NAMESPACE, "message": INTERRUPTED_MESSAGE},
        ).scalars()
        return sorted(int(i) for i in ids)


def finish_run(
    engine: Engine,
    run_id: int,
    *,
    finished_at: datetime,
    status: str,
    error_kind: str = "",
    message: str = "",
    rows_read: int = 0,
    rows_written: int = 0,
    rows_quarantined: int = 0,
    window_start_at: datetime | None = None,
    window_end_at: datetime | None = None,
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                UPDATE collect_run SET finished_at = :finished_at, status = :status,
                    error_kind = :error_kind, message = :message, rows_read = :rows_read,
                    rows_written = :rows_written, rows_quarantined = :rows_quarantined,
                    window_start_at = :window_start_at, window_end_at = :window_end_at
                WHERE id = :id
                """
            ),
            {
                "id": run_id,
                "finished_at": finished_at,
                "status": status,
                "error_kind": storable_text(error_kind, 200),
                "message": storable_text(message, 8000),
                "rows_read": rows_read,
                "rows_written": rows_written,
                "rows_quarantined": rows_quarantined,
                "window_start_at": window_start_at,
                "window_end_at": window_end_at,
            },
        )


def recent_runs(conn: Connection, source: str | None = None, limit: int = 20) -> Sequence[CollectRun]:
    result = conn.execute(
        text(
            """
            SELECT id, source, mode, started_at, finished_at, status, error_kind, message,
                   rows_read, rows_written, rows_quarantined
            FROM collect_run
            WHERE (CAST(:source AS text) IS NULL OR source = :source)
            ORDER BY started_at DESC, id DESC LIMIT :limit
            """
        ),
        {"source": source, "limit": limit},
    )
    return [CollectRun(*row) for row in result]


def get_cursor(conn: Connection, source: str, scope: str) -> datetime | None:
    return conn.execute(
        text("SELECT cursor_at FROM source_cursor WHERE source = :source AND scope = :scope"),
        {"source": source, "scope": scope},
    ).scalar_one_or_none()


def set_cursor(conn: Connection, source: str, scope: str, cursor_at: datetime) -> None:
    """Move the cursor forward (never back), in the caller's transaction."""
    conn.execute(
        text(
            """
            INSERT INTO source_cursor (source, scope, cursor_at) VALUES (:source, :scope, :cursor_at)
            ON CONFLICT (source, scope) DO UPDATE
            SET cursor_at = greatest(source_cursor.cursor_at, EXCLUDED.cursor_at), updated_at = now()
            """
        ),
        {"source": source, "scope": scope, "cursor_at": cursor_at},
    )
