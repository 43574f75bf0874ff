"""Advisory locks: every key slurmtel takes, in one place so no two collide, and the SQL that
takes them. Transaction-scoped, except the actions lease: a session lock held by the one process
that evaluates rules and delivers (slurmtel.actions.cycle), released by PostgreSQL the moment
that process's connection ends, kill -9 included. (store/runs.py's per-run session locks use
their own namespace and the run's id.)"""

from __future__ import annotations

from sqlalchemy import Connection, text

ATTRIBUTION_LOCK_KEY = 7_355_608_001  # attribution runs
WRITE_LOCK_KEY = 7_355_608_002  # attempt writes
PARTITION_LOCK_KEY = 7_355_608_003  # gpu_summary partition creation
CLOSE_LOCK_KEY = 7_355_608_004  # closing (or voiding) a chargeback month
ACTIONS_LEASE_KEY = 7_355_608_005  # evaluating the action rules and delivering (a session lock)


def advisory_xact_lock(conn: Connection, key: int) -> None:
    """Wait for the advisory lock KEY; it is held until the transaction ends."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def try_session_lock(conn: Connection, key: int) -> bool:
    """Take the session advisory lock KEY if no other session holds it; held until
    release_session_lock or the end of the session."""
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar_one())


def release_session_lock(conn: Connection, key: int) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})


def session_lock_holder(conn: Connection, key: int) -> str | None:
    """The application name and pid of the session holding the session lock KEY, if any."""
    row = conn.execute(
        text(
            """
            SELECT a.application_name, a.pid, a.client_addr FROM pg_locks l
            JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted
              AND (CAST(l.classid AS bigint) << 32) | CAST(l.objid AS bigint) = :key AND l.objsubid = 1
            """
        ),
        {"key": key},
    ).first()
    if row is None:
        return None
    return f"{row[0] or 'a session'} (backend pid {row[1]})"
