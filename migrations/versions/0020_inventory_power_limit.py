"""gpu_inventory.power_limit_watts: each GPU's power cap, for `slurmtel job --plot`

Revision ID: 0020
Revises: 0015

The researcher's plot draws each GPU's memory capacity and power limit as reference lines
(issue 22 item 8). The inventory kept the memory (memory_total_bytes) but not the power cap:
the node agent now reads it from NVML (nvmlDeviceGetEnforcedPowerLimit), dcgm-exporter's
DCGM_FI_DEV_POWER_MGMT_LIMIT gives it, and nvidia-smi -q its Current Power Limit. NULL where
it is not known (rows from before, a MIG instance, an exporter that does not export it).
"""

from alembic import op

revision = "0020"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE gpu_inventory ADD COLUMN power_limit_watts real")


def downgrade() -> None:
    op.execute("ALTER TABLE gpu_inventory DROP COLUMN power_limit_watts")
