"""Binary COPY, the one bulk-write primitive of the store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection


def copy_rows(
    conn: Connection, table: str, columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]
) -> None:
    """COPY ROWS into TABLE in binary format; COLUMNS are (name, PostgreSQL type) pairs."""
    raw = conn.connection.driver_connection
    assert raw is not None
    names = ", ".join(name for name, _ in columns)
    with raw.cursor() as cur, cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([pgtype for _, pgtype in columns])
        for row in rows:
            copy.write_row(row)
