"""Collect runs (one row per run of a source) and per-source cursors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, text


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


def start_run(engine: Engine, source: str, mode: str, started_at: datetime) -> int:
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO collect_run (source, mode, started_at, status) "
                    "VALUES (:source, :mode, :started_at, 'running') RETURNING id"
                ),
                {"source": source, "mode": mode, "started_at": started_at},
            ).scalar_one()
        )


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
                "error_kind": error_kind,
                "message": message,
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
