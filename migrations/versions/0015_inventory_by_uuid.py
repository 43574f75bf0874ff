"""gpu_inventory by GPU UUID

Revision ID: 0015
Revises: 0014

The attribution run takes each mapped GPU's fraction (a MIG slice's share of its GPU) from the
GPU's latest inventory row, and `slurmtel job` takes its model and memory the same way: a
lookup by gpu_uuid, which no index led with. Each lookup scanned the whole inventory: at
10,000 GPUs, 0.6 ms for each of the 11,000 GPUs of a run's dirty attempts, 5 of the run's
6-14 s (benchmarks/scale.py).
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX gpu_inventory_uuid ON gpu_inventory (gpu_uuid, last_seen_at)")


def downgrade() -> None:
    op.execute("DROP INDEX gpu_inventory_uuid")
