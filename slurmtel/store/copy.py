"""Binary COPY, the one bulk-write primitive of the store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from psycopg.types.json import set_json_dumps
from sqlalchemy import Connection


def _dump_json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def copy_rows(
    conn: Connection, table: str, columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]
) -> None:
    """COPY ROWS into TABLE in binary format; COLUMNS are (name, PostgreSQL type) pairs."""
    raw = conn.connection.driver_connection
    assert raw is not None
    # jsonb values are dumped by orjson (several times faster than json; sorted keys, so the
    # same map is always the same text)
    set_json_dumps(_dump_json, context=raw)
    names = ", ".join(name for name, _ in columns)
    with raw.cursor() as cur, cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([pgtype for _, pgtype in columns])
        for row in rows:
            copy.write_row(row)
