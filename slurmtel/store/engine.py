"""Engines: one per process, made from the config, never at import time."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from slurmtel.config import Config
from slurmtel.errors import DatabaseUnavailable
from slurmtel.store.embedded import embedded_url_of
from slurmtel.store.sql import session_arguments


def normalize_url(url: str) -> str:
    """Accept plain postgresql:// URLs (libpq style) and use psycopg 3 for them."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgres+psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def display_url(url: str | URL) -> str:
    """URL as messages show it: the password masked wherever it is given, in the user part
    (`user:PASSWORD@host`) or as a query parameter (`?password=...`, `sslpassword=...`)."""
    from slurmtel.logs import redact

    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return redact(str(url))
    # the user part by SQLAlchemy, password= query parameters by the log masking
    return redact(parsed.render_as_string(hide_password=True))


def database_url(config: Config) -> str:
    url = config.database_url()
    if url is None:
        return embedded_url_of(config)
    return normalize_url(url)


def make_engine(config: Config, url: str | None = None) -> Engine:
    engine = create_engine(
        url or database_url(config),
        pool_pre_ping=True,
        connect_args=session_arguments(config),
    )
    return engine


def check_connection(engine: Engine, database: str | None = None) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        raise _unavailable(engine, exc, database) from exc


def _unavailable(engine: Engine, exc: OperationalError, database: str | None) -> DatabaseUnavailable:
    where = database or f"PostgreSQL at {display_url(engine.url)}"
    return DatabaseUnavailable(f"cannot connect to {where}: {exc.orig}")


def require_schema(engine: Engine, database: str | None = None) -> None:
    """Fail clearly when the database cannot be reached, or its schema is missing or older
    than this slurmtel: one connection and two short queries (alembic is not loaded).
    DATABASE names it and why it is the one, for the message (Config.database_description);
    by default its URL."""
    from slurmtel.store.migrate import check_revision, current_revision

    try:
        current = current_revision(engine)
    except OperationalError as exc:
        raise _unavailable(engine, exc, database) from exc
    check_revision(current, database or f"the database {display_url(engine.url)}")
