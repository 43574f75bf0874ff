from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from slurmtel.errors import SchemaMissing
from slurmtel.store.engine import require_schema
from slurmtel.store.migrate import current_revision, downgrade, head_revision, upgrade


@pytest.fixture
def empty_engine(server_url: str) -> Iterator[Engine]:
    name = f"slurmtel_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(make_url(server_url).set(database=name))
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_missing_schema_is_explained(empty_engine: Engine) -> None:
    with pytest.raises(SchemaMissing, match="slurmtel db upgrade"):
        require_schema(empty_engine)


def test_upgrade_downgrade_upgrade(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    assert current_revision(empty_engine) == head_revision()
    require_schema(empty_engine)
    tables = set(inspect(empty_engine).get_table_names())
    assert {
        "job_attempt",
        "quarantine",
        "collect_run",
        "source_cursor",
        "outcome_class",
        "gpu_summary",
        "gpu_inventory",
        "gpu_allocation",
        "node_state",
    } <= tables
    downgrade(empty_engine, "base")
    assert current_revision(empty_engine) is None
    assert set(inspect(empty_engine).get_table_names()) <= {"alembic_version"}
    upgrade(empty_engine)
    assert current_revision(empty_engine) == head_revision()


def test_an_older_schema_is_explained(empty_engine: Engine) -> None:
    upgrade(empty_engine, "0001")
    with pytest.raises(SchemaMissing, match="needs"):
        require_schema(empty_engine)
