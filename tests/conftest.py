"""Shared test fixtures: a real PostgreSQL, the real captures, a fixed clock.

PostgreSQL: the server named by SLURMTEL_TEST_DSN (a libpq/SQLAlchemy URL whose user may
create databases), else an embedded server (pgserver) started for this test session. Either
way the session works in a database of its own, created with the real Alembic migrations and
dropped at the end.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from slurmtel.config import Config
from slurmtel.store.engine import make_engine, normalize_url
from slurmtel.store.migrate import upgrade

FIXTURES = Path(__file__).parent / "fixtures"
# how long the real-Slurm tests may take each (they bring up a cluster and run a scenario)
SLURM_TEST_TIMEOUT_SECONDS = 1800
# seconds any wait on the test PostgreSQL may take: connecting, and a lock another session holds
PG_CONNECT_TIMEOUT_SECONDS = 10
PG_LOCK_TIMEOUT = "30s"


def pytest_configure(config: pytest.Config) -> None:
    # site.timezone's default is the host's zone ($TZ, else /etc/localtime): the suite runs in
    # UTC wherever it runs; a test that means another zone sets site.timezone or TZ itself
    os.environ["TZ"] = "UTC"
    # the system tools the suite runs as root (useradd, runuser, munged, slurmctld) live in the
    # sbin directories, which a PATH made for an ordinary user (env -i, cron, some CI) lacks
    path = os.environ.get("PATH", "").split(os.pathsep)
    missing = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in path and os.path.isdir(d)]
    if missing:
        os.environ["PATH"] = os.pathsep.join([*path, *missing])
    # a state directory of the session's own: a demo the developer ran (its config in
    # ~/.local/state/slurmtel/demo, which `slurmtel` finds when given no other) never leaks into a test
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="slurmtel-test-state-")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    state = os.environ.get("XDG_STATE_HOME", "")
    if Path(state).name.startswith("slurmtel-test-state-"):
        shutil.rmtree(state, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-Slurm tests get a longer per-test timeout than the default (pyproject)."""
    for item in items:
        if item.get_closest_marker("slurm") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLURM_TEST_TIMEOUT_SECONDS))


def fixture_path(*parts: str) -> Path:
    path = FIXTURES.joinpath(*parts)
    assert path.exists(), f"missing fixture {path}"
    return path


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of a database on which this session may CREATE DATABASE."""
    dsn = os.environ.get("SLURMTEL_TEST_DSN")
    if dsn:
        yield normalize_url(dsn)
        return
    import pgserver

    with tempfile.TemporaryDirectory(prefix="slurmtel-test-pg-") as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
        from slurmtel.store.embedded import _sqlalchemy_url

        yield _sqlalchemy_url(server.get_uri(), "postgres")
        server.cleanup()


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    name = f"slurmtel_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(
        server_url,
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS},
    )
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS})
    upgrade(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@dataclass(frozen=True)
class LoginRoles:
    """The session's login roles of the daemon, the API and Grafana (`slurmtel db roles`)."""

    database_url: str
    writer: str
    reader: str
    aggregate: str
    # the API's scope key, installed in the test database (slurmtel.store.rls)
    scope_key: bytes = b""

    def url(self, role: str) -> str:
        """The test database as ROLE (the test server trusts TCP logins: no password)."""
        return (
            make_url(self.database_url)
            .set(username=role, password=None)
            .render_as_string(hide_password=False)
        )

    def reader_engine(self) -> Engine:
        """The reader's engine as the API has it: its scopes proven with the scope key."""
        from slurmtel.store.rls import sign_scopes

        return sign_scopes(create_engine(self.url(self.reader)), self.scope_key)


@pytest.fixture(scope="session")
def login_roles(database_url: str) -> Iterator[LoginRoles]:
    """Login roles in the groups of migration 0010, named for this session (roles are
    cluster-wide, and other sessions may share the server); dropped at the end."""
    from slurmtel.store.rls import install_scope_key, new_scope_key
    from slurmtel.store.roles import AGGREGATE_GROUP, READER_GROUP, WRITER_GROUP, ensure_login_role

    tag = uuid.uuid4().hex[:8]
    roles = LoginRoles(
        database_url,
        f"slurmtel_t_writer_{tag}",
        f"slurmtel_t_reader_{tag}",
        f"slurmtel_t_agg_{tag}",
        new_scope_key(),
    )
    engine = create_engine(database_url, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS})
    with engine.begin() as conn:
        install_scope_key(conn, roles.scope_key)
        ensure_login_role(conn, roles.writer, WRITER_GROUP)
        ensure_login_role(conn, roles.reader, READER_GROUP)
        ensure_login_role(conn, roles.aggregate, AGGREGATE_GROUP, timezone="UTC")
    yield roles
    drop_login_roles(engine, [roles.writer, roles.reader, roles.aggregate])
    engine.dispose()


def drop_login_roles(engine: Engine, names: list[str]) -> None:
    """Drop login roles NAMES, ending their sessions first (a session's temporary tables are
    objects its role owns, and engines made by commands run in-process are still open)."""
    with engine.connect() as conn:
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(:names)"),
            {"names": names},
        )
        conn.commit()
        # a backend ends (and drops its temporary tables) just after it is told to
        for _ in range(1000):
            left = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE usename = ANY(:names)"), {"names": names}
            ).scalar_one()
            conn.commit()
            if not left:
                break
            conn.execute(text("SELECT pg_sleep(0.01)"))
        for name in names:
            conn.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
        conn.commit()


@pytest.fixture(scope="session")
def _session_engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(Config(), database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def engine(_session_engine: Engine) -> Engine:
    """The test database with every slurmtel table emptied.

    A session an earlier test left open (a thread still in its transaction) would make the
    TRUNCATE wait for ever: it waits PG_LOCK_TIMEOUT, then ends the other sessions and retries.
    """
    try:
        _empty_tables(_session_engine)
    except OperationalError:
        with _session_engine.begin() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        _session_engine.dispose()
        _empty_tables(_session_engine)
    return _session_engine


def _empty_tables(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{PG_LOCK_TIMEOUT}'"))
        tables = (
            conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename NOT IN ('alembic_version', 'scope_key') "
                    "AND tablename NOT IN (SELECT inhrelid::regclass::text FROM pg_inherits)"
                )
            )
            .scalars()
            .all()
        )
        if tables:
            conn.execute(
                text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE")
            )


@pytest.fixture
def config() -> Config:
    return Config()


FIXED_NOW = datetime(2026, 12, 2, 14, 0, 0, tzinfo=UTC)


@pytest.fixture
def ctx(config: Config, engine: Engine):  # type: ignore[no-untyped-def]
    from slurmtel.sources.base import RunContext

    return RunContext(config=config, engine=engine, clock=lambda: FIXED_NOW)
