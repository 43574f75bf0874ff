"""The benchmarks' scratch database: created, migrated, handed out, dropped.

The server is --dsn, else $SLURMTEL_TEST_DSN / $SLURMTEL_DATABASE_URL, else an embedded
PostgreSQL started for the run.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from slurmtel.config import Config
from slurmtel.store.engine import make_engine, normalize_url
from slurmtel.store.migrate import upgrade


def configured_server(dsn: str | None) -> str | None:
    """The server given: --dsn, else $SLURMTEL_TEST_DSN / $SLURMTEL_DATABASE_URL (None: none)."""
    return dsn or os.environ.get("SLURMTEL_TEST_DSN") or os.environ.get("SLURMTEL_DATABASE_URL")


@contextmanager
def server_url(dsn: str | None) -> Iterator[str]:
    """A URL of a database on which the benchmark may CREATE DATABASE."""
    url = configured_server(dsn)
    if url:
        yield normalize_url(url)
        return
    import pgserver

    from slurmtel.store.embedded import _sqlalchemy_url

    with tempfile.TemporaryDirectory(prefix="slurmtel-bench-") as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
        yield _sqlalchemy_url(server.get_uri(), "postgres")
        server.cleanup()


@contextmanager
def scratch_database(
    dsn: str | None, *, config: Config | None = None, prefix: str = "slurmtel_bench", keep: bool = False
) -> Iterator[Engine]:
    """An engine on a new, migrated database; dropped afterwards unless KEEP."""
    with server_url(dsn) as base:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        admin = create_engine(base, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        engine = make_engine(
            config or Config(), make_url(base).set(database=name).render_as_string(hide_password=False)
        )
        try:
            upgrade(engine)
            yield engine
        finally:
            engine.dispose()
            if keep:
                print(f"kept the database {name}")
            else:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
