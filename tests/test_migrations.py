from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from slurmtel.errors import SchemaMissing
from slurmtel.store.engine import require_schema
from slurmtel.store.migrate import current_revision, downgrade, head_revision, upgrade
from slurmtel.store.telemetry import pack_windows


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
        "gpu_window",
        "gpu_window_hour",
        "gpu_inventory",
        "gpu_allocation",
        "node_state",
    } <= tables
    assert "gpu_summary" in inspect(empty_engine).get_view_names()
    downgrade(empty_engine, "base")
    assert current_revision(empty_engine) is None
    assert set(inspect(empty_engine).get_table_names()) <= {"alembic_version"}
    upgrade(empty_engine)
    assert current_revision(empty_engine) == head_revision()


def test_an_older_schema_is_explained(empty_engine: Engine) -> None:
    upgrade(empty_engine, "0001")
    with pytest.raises(SchemaMissing, match="needs"):
        require_schema(empty_engine)


def test_windows_stored_before_packing_survive_the_upgrade_and_the_downgrade(empty_engine: Engine) -> None:
    """0012 renames gpu_summary to gpu_window and makes gpu_summary a view of it and of the
    packed hours; its downgrade unpacks them back into one row each."""
    upgrade(empty_engine, "0011")
    with empty_engine.begin() as conn:
        conn.execute(text("SELECT slurmtel_create_summary_partition(DATE '2026-11-01')"))
        conn.execute(
            text(
                "INSERT INTO ingest_batch (source, node, window_min_at, window_max_at, rows) "
                "VALUES ('agent', 'gpu01', '2026-11-01 10:00+00', '2026-11-01 10:59:30+00', 120)"
            )
        )
        conn.execute(
            text(
                """
                INSERT INTO gpu_summary (source, node, gpu_uuid, window_start_at, window_seconds, util_metric,
                    sample_count, covered_seconds, util_mean_percent, idle_seconds, job_ids, batch_id)
                SELECT 'agent', 'gpu01', 'GPU-m', t, 30, 'gr_engine_active', 30, 30, 42.5, 0, ARRAY['7'], 1
                FROM generate_series(TIMESTAMPTZ '2026-11-01 10:00+00', '2026-11-01 10:59:30+00', '30 seconds') t
                """
            )
        )
    upgrade(empty_engine)
    windows = "SELECT count(*), sum(util_mean_percent), min(job_ids[1]) FROM gpu_summary"
    with empty_engine.begin() as conn:
        assert conn.execute(text(windows)).one() == (120, 5100.0, "7")
        conn.execute(text("INSERT INTO attribution_batch (batch_id) VALUES (1)"))
        assert pack_windows(conn, now=datetime(2026, 11, 2, tzinfo=UTC)) == 120
        assert conn.execute(text("SELECT count(*) FROM gpu_window_hour")).scalar_one() == 1
        assert conn.execute(text(windows)).one() == (120, 5100.0, "7")
    downgrade(empty_engine, "0011")
    with empty_engine.connect() as conn:
        assert conn.execute(text(windows)).one() == (120, 5100.0, "7")
        parts = conn.execute(
            text("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                 "WHERE i.inhparent = 'gpu_summary'::regclass")
        ).scalars().all()  # fmt: skip
    assert parts == ["gpu_summary_20261101"]
