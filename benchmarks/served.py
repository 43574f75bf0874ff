"""The read API's own path to the database, for benchmarks that time a question as `slurmtel
serve` answers it: a reader login role in the benchmark's scratch database (the group of
`slurmtel db roles`), the scope key installed, and ReadApi on that role's engine, whose
transactions prove their scope to row security and commit.

What differs from a read on an engine's pooled connection that ends in a rollback (what a
`with engine.connect()` block does): psycopg deallocates every statement it has prepared on a
ROLLBACK, so such reads plan every statement every time; the API's transactions commit, and a
statement its connection has run five times is prepared and planned once (about half of
`slurmtel job`'s SQL time, benchmarks/job_sql.py). The role logs in without a password: the
scratch server trusts local logins (pgserver's, or the test server's).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Engine, make_url, text

from slurmtel.api.app import ReadApi
from slurmtel.auth.identity import AuthSettings
from slurmtel.config import Config
from slurmtel.store.engine import make_engine
from slurmtel.store.rls import install_scope_key, new_scope_key
from slurmtel.store.roles import READER_GROUP, ensure_login_role


@contextmanager
def served_api(engine: Engine, config: Config, now: datetime) -> Iterator[ReadApi]:
    """ReadApi over ENGINE's database as the reader role (dropped afterwards), its clock NOW."""
    reader = f"slurmtel_bench_reader_{uuid.uuid4().hex[:8]}"
    key = new_scope_key()
    with engine.begin() as conn:
        install_scope_key(conn, key)
        ensure_login_role(conn, reader, READER_GROUP)
    url = make_url(engine.url).set(username=reader, password=None).render_as_string(hide_password=False)
    reader_engine = make_engine(config, url)
    try:
        yield ReadApi(config, reader_engine, AuthSettings(), lambda: now, engine, scope_key=key)
    finally:
        reader_engine.dispose()
        with engine.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :name"),
                {"name": reader},
            )
            conn.execute(text(f'DROP ROLE IF EXISTS "{reader}"'))
            conn.commit()
