"""The embedded PostgreSQL: started by slurmtel under its state directory when no URL is set."""

from __future__ import annotations

import logging
import os
import pwd
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
    pgdata = state_dir / "pgdata"
    _check_owner(pgdata)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create the state directory {state_dir} for the embedded PostgreSQL: "
            f"{exc.strerror}; set site.state_dir or database.url"
        ) from exc
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


def _check_owner(pgdata: Path, uid: int | None = None) -> None:
    """Refuse, before pgserver touches it, a data directory another unix user owns: PostgreSQL
    runs as its owner only, and pgserver would fail on its files with a traceback at exit."""
    try:
        owner = pgdata.stat().st_uid
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot open the embedded PostgreSQL in {pgdata}: {exc.strerror}") from exc
    caller = os.getuid() if uid is None else uid
    # root may open any (pgserver runs the server of root as its own "pgserver" user)
    if owner != caller and caller != 0:
        try:
            name = pwd.getpwuid(owner).pw_name
        except KeyError:
            name = f"uid {owner}"
        if name == "pgserver":
            name = "root"
        raise DatabaseUnavailable(
            f"the embedded PostgreSQL in {pgdata} belongs to {name}: run slurmtel as {name}, "
            "or give this user its own site.state_dir, or set database.url"
        )


def _sqlalchemy_url(uri: str, database: str) -> str:
    """pgserver gives postgresql://postgres:@/postgres?host=/socket/dir; point it at DATABASE."""
    parsed = urlparse(uri)
    host = parse_qs(parsed.query).get("host", [""])[0]
    user = parsed.username or "postgres"
    return f"postgresql+psycopg://{user}@/{database}?host={host}"
