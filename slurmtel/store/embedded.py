"""The embedded PostgreSQL: started by slurmtel under its state directory when no URL is set.

pgserver starts the server once and lets every process that uses it join; each process adds its
pid to `<pgdata>/.handle_pids.json` and, when it exits (atexit), removes it, and the last one
stops the server. A process killed before its atexit ran (SIGKILL, or a signal nobody turned
into an exit: the CLI turns SIGTERM into one, slurmtel.cli) leaves its pid behind, and then no
process is ever the last: joining removes the pids of processes that are gone, so the next
command to exit stops the server again. The start itself runs with SIGINT and SIGTERM held
back: a signal in the middle would leave a server running that no handle knows of.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlparse

from slurmtel.errors import ConfigError, DatabaseUnavailable
from slurmtel.threads import signals_held

if TYPE_CHECKING:
    from slurmtel.config import Config

log = logging.getLogger(__name__)

DATABASE = "slurmtel"
# pgserver's list of the processes using a server (pgserver.utils.DiskList)
HANDLES_FILE = ".handle_pids.json"


def embedded_url_of(config: Config) -> str:
    """The URL of CONFIG's embedded PostgreSQL (no database URL is configured), started or
    joined. Never on a login-node client (api.url set): ConfigError before anything is made."""
    if config.api.url:
        raise ConfigError(config.head_only_message())
    return embedded_url(config.state_dir(), why=config.database_origin())


def embedded_url(state_dir: Path, why: str = "") -> str:
    """Start (or join) the embedded server under STATE_DIR/pgdata and return its SQLAlchemy URL.
    WHY (why it is the embedded one: no database.url in which config) goes into its errors.

    The server stops when the last slurmtel process using it exits.
    """
    because = f" ({why})" if why else ""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root, cron, CI) and falls back to /tmp
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:  # pragma: no cover - pgserver is a runtime dependency
        raise DatabaseUnavailable(
            f"no database.url is configured{because} and the embedded PostgreSQL (pgserver) is not installed"
        ) from exc
    # pgserver logs every pg_ctl call at INFO; its errors still come through
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    pgdata = state_dir / "pgdata"
    _check_owner(pgdata)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create the state directory {state_dir} for the embedded PostgreSQL{because}: "
            f"{exc.strerror}; set site.state_dir or database.url"
        ) from exc
    log.debug("starting embedded PostgreSQL in %s", pgdata)
    try:
        with warnings.catch_warnings(), signals_held():
            warnings.simplefilter("ignore")
            with pgserver.PostgresServer._lock:
                forget_gone_handles(pgdata)
            server = pgserver.get_server(pgdata, cleanup_mode="stop")
        uri = server.get_uri()
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';")
        if "(1 row)" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE};")
    except Exception as exc:  # pgserver raises plain exceptions from initdb/pg_ctl
        raise DatabaseUnavailable(f"embedded PostgreSQL in {pgdata}{because} did not start: {exc}") from exc
    return _sqlalchemy_url(uri, DATABASE)


def forget_gone_handles(pgdata: Path) -> list[int]:
    """Remove from PGDATA's handle list the pids of processes that no longer run (killed before
    they could remove themselves); returns them. Call it holding pgserver's lock."""
    handles = pgdata / HANDLES_FILE
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(pids, list):
        return []
    gone = [pid for pid in pids if not process_running(pid)]
    if gone:
        log.debug("embedded PostgreSQL in %s: processes %s ended without leaving it", pgdata, gone)
        handles.write_text(json.dumps([pid for pid in pids if pid not in gone]))
    return gone


def process_running(pid: object) -> bool:
    """Whether PID is a process that runs: not gone, not a zombie (ended, not yet reaped)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's (pgserver's, when root runs it): it is there
    try:
        # /proc/PID/stat: "pid (comm) S ...", the state after the last ")"
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


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
