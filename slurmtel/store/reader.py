"""The connection a read command (`slurmtel job`, `me`, `report`) opens: psycopg alone for a
PostgreSQL URL, so that SQLAlchemy is not loaded (slurmtel.store.sql); SQLAlchemy's for any
other URL."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from slurmtel.errors import DatabaseUnavailable
from slurmtel.store.sql import Connection, ReadConnection, session_arguments

if TYPE_CHECKING:
    from slurmtel.config import Config


class NotForPsycopg(ValueError):
    """A URL the reader does not connect by itself (the caller uses SQLAlchemy for it)."""


# sqlalchemy.engine.url's grammar: driver://user:password@host:port/database?query
_URL = re.compile(
    r"^(?P<driver>[\w+]+)://"
    r"(?:(?P<user>[^:/]*)(?::(?P<password>[^@]*))?@)?"
    r"(?:(?:\[(?P<ipv6>[^/?]+)\]|(?P<host>[^/:?]+))?(?::(?P<port>[^/?]*))?)?"
    r"(?:/(?P<database>[^?]*))?"
    r"(?:\?(?P<query>.*))?$",
    re.S,
)
_PSYCOPG_DRIVERS = ("postgresql", "postgres", "postgresql+psycopg", "postgres+psycopg")


def connect_arguments(url: str) -> dict[str, Any]:
    """psycopg.connect's keyword arguments for a slurmtel database URL, as SQLAlchemy's
    psycopg dialect makes them (user, password, host, port, dbname, then every query parameter
    as a libpq keyword). Raises NotForPsycopg for another driver, a query parameter given twice
    (SQLAlchemy's multi-host form) or what is no such URL."""
    match = _URL.match(url)
    if match is None or match["driver"] not in _PSYCOPG_DRIVERS:
        raise NotForPsycopg(url)
    arguments: dict[str, Any] = {}
    for key, group in (("user", "user"), ("password", "password"), ("dbname", "database")):
        if match[group]:
            arguments[key] = unquote(match[group])
    if match["ipv6"] or match["host"]:
        arguments["host"] = match["ipv6"] or match["host"]
    if match["port"]:
        arguments["port"] = int(match["port"])
    query = parse_qsl(match["query"] or "", keep_blank_values=True)
    if len({key for key, _ in query}) != len(query):
        raise NotForPsycopg(url)
    arguments.update(query)
    return arguments


@contextlib.contextmanager
def connect_reader(config: Config) -> Iterator[Connection]:
    """A connection to the site's database for reading, its schema checked (see
    engine.require_schema): over psycopg alone when the URL allows, else SQLAlchemy's."""
    url = config.database_url()
    if url is None:
        from slurmtel.store.embedded import embedded_url_of

        url = embedded_url_of(config)
    database = config.database_description()
    try:
        arguments = connect_arguments(url)
    except ValueError:  # NotForPsycopg, or a port that is no number
        from slurmtel.store.engine import make_engine, require_schema

        engine = make_engine(config)
        require_schema(engine, database)
        with engine.connect() as engine_conn:
            yield engine_conn
        return
    import psycopg

    try:
        # as SQLAlchemy does, the engine's connect arguments win over the URL's
        pg = psycopg.connect(**{**arguments, **session_arguments(config)})
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to {database}: {exc}") from exc
    conn = ReadConnection(pg)
    try:
        from slurmtel.store.migrate import check_revision, schema_revision

        check_revision(schema_revision(conn), database)
        yield conn
    finally:
        conn.close()
