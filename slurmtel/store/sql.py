"""SQL text and the connections the read paths run it on, without SQLAlchemy when they can.

Importing SQLAlchemy costs a command about 0.15 s of its 0.3 s (issue 12), so the store's read
functions (`slurmtel job`, `me`, `report`) take any `Connection`: SQLAlchemy's (the daemon, the
API, the tests) or a `ReadConnection` over psycopg alone (the CLI on the head node). Their SQL
is written once, with SQLAlchemy's `:name` parameters, and `text()` from here:

- a `Statement` runs on a SQLAlchemy connection exactly as `sqlalchemy.text()` of the same
  string would (it implements the hook `Connection.execute` calls on what it is given);
- a `ReadConnection` turns `:name` into psycopg's `%(name)s` by the same rule SQLAlchemy uses,
  and gives the results the part of SQLAlchemy's result API the read functions use (rows by
  position and by attribute, `.mappings()`, `.one()`, `.scalar()`, `.scalars()`, `.all()`).

slurmtel.store.reader opens the connection a read command uses.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import psycopg

    from slurmtel.config import Config


def session_arguments(config: Config) -> dict[str, Any]:
    """The connect arguments of every slurmtel connection, SQLAlchemy's engine or psycopg's."""
    return {
        "connect_timeout": config.database.connect_timeout_seconds,
        # JIT compiles our short rollup and report queries for a second or more and gains nothing
        "options": "-c jit=off",
    }


def plan_once(conn: Connection) -> None:
    """For the rest of CONN's transaction, a statement prepared on the connection (psycopg
    prepares one it has run five times) keeps a generic plan instead of being planned again
    with each call's values: for the reads whose planning costs more than their running and
    whose best plan does not depend on the values (one job's)."""
    conn.execute(_PLAN_ONCE)


class Rows(Protocol):
    """What the read functions use of a statement's result (SQLAlchemy's CursorResult, or
    Result below)."""

    @property
    def rowcount(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def all(self) -> Sequence[Any]: ...

    def first(self) -> Any: ...

    def one(self) -> Any: ...

    def scalar(self) -> Any: ...

    def scalar_one(self) -> Any: ...

    def scalar_one_or_none(self) -> Any: ...

    def scalars(self) -> Any: ...

    def mappings(self) -> Any: ...


class Connection(Protocol):
    """What a read function needs of its connection: SQLAlchemy's Connection has it, and so
    has ReadConnection."""

    def execute(self, statement: Any, parameters: Any = None, /) -> Rows: ...


@dataclass(frozen=True, slots=True)
class Statement:
    """SQL text with `:name` parameters (as sqlalchemy.text), runnable on either connection."""

    text: str

    def _execute_on_connection(self, connection: Any, distilled_params: Any, execution_options: Any) -> Any:
        # SQLAlchemy's Connection.execute calls this on the object it is given (every
        # executable has it): run there as the TextClause of the same text
        return _text_clause(self.text)._execute_on_connection(connection, distilled_params, execution_options)


def text(sql: str) -> Statement:
    return Statement(sql)


@lru_cache(maxsize=256)
def _text_clause(sql: str) -> Any:
    """sqlalchemy.text(SQL), made once per text: building it scans the text for its bind
    parameters, 0.25 ms of a `slurmtel job` statement's (issue 28); a TextClause is not changed
    by running it, so one serves every run."""
    from sqlalchemy import text

    return text(sql)


# SQLAlchemy's rule for a bind parameter in text(): a colon and a name, not after a colon, a
# word character or a backslash, nor before a colon (so `x::int` is a cast); `\:` is a colon
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@lru_cache(maxsize=256)
def psycopg_sql(sql: str) -> str:
    """SQL with SQLAlchemy's `:name` parameters as psycopg's `%(name)s` (a `%` doubled)."""
    return _BIND.sub(r"%(\1)s", sql.replace("%", "%%")).replace("\\:", ":")


@lru_cache(maxsize=64)
def _row_type(names: tuple[str, ...]) -> type[tuple[Any, ...]]:
    # a name that is no identifier (`?column?`) or repeated is renamed _N, as namedtuple does
    return namedtuple("Row", names, rename=True)


class Mappings:
    """Rows as dicts, as SQLAlchemy's MappingResult gives them."""

    def __init__(self, names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
        self._dicts = [dict(zip(names, row, strict=True)) for row in rows]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._dicts)

    def all(self) -> list[dict[str, Any]]:
        return list(self._dicts)

    def first(self) -> dict[str, Any] | None:
        return self._dicts[0] if self._dicts else None

    def one(self) -> dict[str, Any]:
        return _one(self._dicts)


def _one(rows: Sequence[Any]) -> Any:
    if len(rows) != 1:
        raise LookupError(f"expected one row, got {len(rows)}")
    return rows[0]


class Result:
    """A statement's rows, fetched: each a named tuple (by position and by attribute)."""

    def __init__(self, names: Sequence[str], rows: Sequence[tuple[Any, ...]], rowcount: int) -> None:
        self._names = tuple(names)
        self._rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        row = _row_type(self._names)
        return (row(*values) for values in self._rows)

    def all(self) -> list[Any]:
        return list(self)

    def first(self) -> Any:
        return next(iter(self), None)

    def one(self) -> Any:
        return _one(self.all())

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        return _one(self._rows)[0]

    def scalar_one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise LookupError(f"expected at most one row, got {len(self._rows)}")
        return self._rows[0][0] if self._rows else None

    def scalars(self) -> list[Any]:
        return [values[0] for values in self._rows]

    def mappings(self) -> Mappings:
        return Mappings(self._names, self._rows)


class ReadConnection:
    """A psycopg connection for the read functions. Its statements run in one transaction,
    rolled back when it closes: `SET LOCAL` holds for the rest of the connection, as within
    one SQLAlchemy connection's transaction."""

    def __init__(self, connection: psycopg.Connection[tuple[Any, ...]]) -> None:
        self._connection = connection

    def execute(self, statement: Statement | Any, parameters: Mapping[str, Any] | None = None, /) -> Result:
        # Statement, or a TextClause: both keep their SQL in .text
        with self._connection.cursor() as cursor:
            cursor.execute(psycopg_sql(statement.text), parameters or {})
            names = [c.name for c in cursor.description or ()]
            rows = cursor.fetchall() if cursor.description is not None else []
            return Result(names, rows, cursor.rowcount)

    @property
    def driver_connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The psycopg connection (a COPY into a temporary table: store/telemetry.py)."""
        return self._connection

    def close(self) -> None:
        self._connection.close()


_PLAN_ONCE = text("SET LOCAL plan_cache_mode = force_generic_plan")
