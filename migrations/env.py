"""Alembic environment. `slurmtel db upgrade` passes its engine in; the plain `alembic` CLI
(alembic -c migrations/alembic.ini upgrade head) falls back to slurmtel's own config."""

from __future__ import annotations

from alembic import context

from slurmtel.config import load_config
from slurmtel.store.engine import make_engine

engine = context.config.attributes.get("engine")
if engine is None:
    engine = make_engine(load_config())

with engine.connect() as connection:
    context.configure(connection=connection, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
