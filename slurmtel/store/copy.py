"""Binary COPY, the one bulk-write primitive of the store."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import orjson
import psycopg
from psycopg import DataError, pq
from psycopg.abc import AdaptContext
from psycopg.adapt import Buffer, Dumper, PyFormat
from psycopg.types.json import Json, Jsonb, set_json_dumps
from psycopg.types.numeric import IntNumericBinaryDumper
from sqlalchemy import Connection

_INT4_OID = 23
_TEXT_OID = 25
_TEXT_ARRAY_OID = 1009
_JSONB_OID = 3802
# binary array header: dimensions, has-nulls flag, element type; then per dimension: length,
# lower bound; then per element: byte length (-1 = NULL) and bytes
_ARRAY_HEAD = struct.Struct("!iiIii")
_EMPTY_TEXT_ARRAY = struct.pack("!iiI", 0, 0, _TEXT_OID)
_LENGTH = struct.Struct("!i")
_NULL = _LENGTH.pack(-1)


def _dump_json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def use_orjson_for_json(raw: psycopg.Connection[Any]) -> None:
    """Have RAW dump jsonb parameters of its statements by orjson (several times faster than
    json; sorted keys, so the same map is always the same text). Once per connection:
    set_json_dumps derives a new dumper class from the connection's current one at every call,
    so calling it again before each COPY grew a subclass chain with every write on a pooled
    connection, and each later call (and so each COPY) got slower (0.3 ms after one call,
    0.4 s after 2,000)."""
    current = raw.adapters.get_dumper(Jsonb, PyFormat.BINARY)
    if getattr(current, "_dumps", None) is not _dump_json:
        set_json_dumps(_dump_json, context=raw)


def text_array(values: Sequence[str | None], encoding: str = "utf-8") -> bytes:
    """A one-dimensional text[] in PostgreSQL's binary format, its text in ENCODING."""
    if not values:
        return _EMPTY_TEXT_ARRAY
    parts = [b""]
    has_null = 0
    for value in values:
        if value is None:
            parts.append(_NULL)
            has_null = 1
        elif type(value) is str:
            data = value.encode(encoding)
            parts += (_LENGTH.pack(len(data)), data)
        else:
            raise DataError(
                f"text[] values must be flat sequences of str or None, got {type(value).__name__}"
            )
    parts[0] = _ARRAY_HEAD.pack(1, has_null, _TEXT_OID, len(values), 1)
    return b"".join(parts)


# node lists repeat across a bulk write, and the parser hands out the same tuple for the same list
_text_array_of_tuple = lru_cache(maxsize=4096)(text_array)


class _TextArrayDumper(Dumper):
    """text[] from a list or tuple of str: psycopg's general list dumper costs a third of a
    COPY's client time, and takes no tuples."""

    format = pq.Format.BINARY
    oid = _TEXT_ARRAY_OID

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        # the client encoding, as psycopg's own text dumpers use it
        self._encoding = self.connection.info.encoding if self.connection else "utf-8"

    def dump(self, obj: Any) -> Buffer | None:
        if type(obj) is tuple and self._encoding == "utf-8":
            return _text_array_of_tuple(obj)
        return text_array(obj, self._encoding)


_INT4 = struct.Struct("!i")


class _Int4Dumper(Dumper):
    """int4 that refuses what does not fit: psycopg's binary int4 dumper keeps the low 32 bits
    of a larger int, and a COPY would store 2**40 as 0 without a word."""

    format = pq.Format.BINARY
    oid = _INT4_OID

    def dump(self, obj: Any) -> Buffer | None:
        try:
            return _INT4.pack(obj)
        except struct.error:
            raise DataError(f"{obj!r} is out of range for an int4 column") from None


class _JsonbDumper(Dumper):
    """jsonb by orjson with sorted keys (the same map is always the same text), without
    psycopg's general JSON dumper around it."""

    format = pq.Format.BINARY
    oid = _JSONB_OID

    def dump(self, obj: Any) -> Buffer | None:
        if type(obj) is not dict and isinstance(obj, Json | Jsonb):
            obj = obj.obj
        return b"\x01" + orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def copy_rows(
    conn: Connection, table: str, columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]
) -> None:
    """COPY ROWS into TABLE in binary format; COLUMNS are (name, PostgreSQL type) pairs.

    text[] values may be lists or tuples of str; jsonb values are dumped by orjson; numeric
    values are ints; an int that does not fit an int4 column is a DataError.
    """
    # a read command's ReadConnection (store/sql.py) is psycopg's own connection
    raw = getattr(conn, "driver_connection", None) or conn.connection.driver_connection
    assert raw is not None
    # jsonb parameters of other statements on this connection are dumped by orjson too
    use_orjson_for_json(raw)
    names = ", ".join(name for name, _ in columns)
    with raw.cursor() as cur:
        # used where the COPY's types are given (set_types below), on this cursor alone
        cur.adapters.register_dumper(None, _TextArrayDumper)
        cur.adapters.register_dumper(None, _Int4Dumper)
        cur.adapters.register_dumper(None, _JsonbDumper)
        # numeric columns take Python ints (slurmdbd's unsigned 64-bit ids)
        cur.adapters.register_dumper(None, IntNumericBinaryDumper)
        with cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types([pgtype for _, pgtype in columns])
            for row in rows:
                copy.write_row(row)


# What writing a row can raise when the row, not the database, is at fault: a value the
# dumpers cannot encode (an int beyond its column, a str with an unpaired surrogate, a
# non-str where text goes, JSON orjson refuses) or one PostgreSQL refuses (a NUL in text,
# a number out of range, a key too long for its index).
ROW_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.DataError,
    psycopg.IntegrityError,
    psycopg.errors.ProgramLimitExceeded,
    OverflowError,
    TypeError,
    ValueError,
    struct.error,
)


def describe_row_error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


def copy_rows_isolating(
    conn: Connection, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
) -> list[tuple[int, str]]:
    """COPY ROWS into TABLE like copy_rows, leaving out the rows that cannot be written.

    Returns (index in ROWS, error) of each row left out. The rows are halved until the
    rows that fail stand alone, each try in its own savepoint: one COPY when all is well,
    about 2 log2(n) more per bad row.
    """
    failed: list[tuple[int, str]] = []

    def attempt(lo: int, hi: int) -> None:
        if lo >= hi:
            return
        savepoint = conn.begin_nested()
        try:
            copy_rows(conn, table, columns, rows[lo:hi])
            savepoint.commit()
        except ROW_ERRORS as exc:
            savepoint.rollback()
            if hi - lo == 1:
                failed.append((lo, describe_row_error(exc)))
                return
            middle = (lo + hi) // 2
            attempt(lo, middle)
            attempt(middle, hi)

    attempt(0, len(rows))
    return failed
