"""The embedded PostgreSQL: started by slurmtel under its state directory when no URL is set."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from slurmtel.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

DATABASE = "slurmtel"


def embedded_url(state_dir: Path) -> str:
    """Start (or join) the embedded server under STATE_DIR/pgdata and return its SQLAlchemy URL.

    The server stops when the last slurmtel process using it exits.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root, cron, CI) and falls back to /tmp
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:  # pragma: no cover - pgserver is a runtime dependency
        raise DatabaseUnavailable(
            "no database.url is configured and the embedded PostgreSQL (pgserver) is not installed"
        ) from exc
    # pgserver logs every pg_ctl call at INFO; its errors still come through
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    state_dir.mkdir(parents=True, exist_ok=True)
    pgdata = state_dir / "pgdata"
    log.debug("starting embedded PostgreSQL in %s", pgdata)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(pgdata, cleanup_mode="stop")
        uri = server.get_uri()
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';")
        if "(1 row)" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE};")
    except Exception as exc:  # pgserver raises plain exceptions from initdb/pg_ctl
        raise DatabaseUnavailable(f"embedded PostgreSQL in {pgdata} did not start: {exc}") from exc
    return _sqlalchemy_url(uri, DATABASE)


def _sqlalchemy_url(uri: str, database: str) -> str:
    """pgserver gives postgresql://postgres:@/postgres?host=/socket/dir; point it at DATABASE."""
    parsed = urlparse(uri)
    host = parse_qs(parsed.query).get("host", [""])[0]
    user = parsed.username or "postgres"
    return f"postgresql+psycopg://{user}@/{database}?host={host}"
