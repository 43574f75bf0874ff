"""Transaction-scoped advisory locks: every key slurmtel takes, in one place so no two collide,
and the one SQL statement that takes them. (store/runs.py's per-run session locks use their own
namespace and the run's id.)"""

from __future__ import annotations

from sqlalchemy import Connection, text

ATTRIBUTION_LOCK_KEY = 7_355_608_001  # attribution runs
WRITE_LOCK_KEY = 7_355_608_002  # attempt writes
PARTITION_LOCK_KEY = 7_355_608_003  # gpu_summary partition creation
CLOSE_LOCK_KEY = 7_355_608_004  # closing (or voiding) a chargeback month


def advisory_xact_lock(conn: Connection, key: int) -> None:
    """Wait for the advisory lock KEY; it is held until the transaction ends."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
