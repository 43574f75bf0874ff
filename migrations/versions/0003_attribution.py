"""attribution: per attempt x GPU x day rollup, processed batches, watermarks

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every allocated GPU-second of every attempt is in exactly one row: a row per GPU the
    # attempt was mapped to (mapping process / slurmctld / whole_node), plus per node and day
    # one row with gpu_uuid '' and mapping 'unmapped' for the allocation no GPU could be
    # mapped to (all unmeasured). Days are the site's days. Kept forever.
    op.execute(
        """
        CREATE TABLE gpu_attribution (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            day date NOT NULL,
            mapping text NOT NULL,
            gpu_fraction real NOT NULL DEFAULT 1.0,
            util_metric text NOT NULL DEFAULT '',
            allocated_seconds double precision NOT NULL,
            covered_seconds double precision NOT NULL,
            busy_seconds double precision NOT NULL,
            idle_seconds double precision NOT NULL,
            no_process_seconds double precision NOT NULL,
            unmeasured_seconds double precision NOT NULL,
            util_weighted_sum double precision NOT NULL DEFAULT 0,
            util_max_percent real,
            memory_used_max_bytes bigint,
            energy_joules double precision,
            computed_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (cluster, job_id_raw, submit_at, node, gpu_uuid, day),
            FOREIGN KEY (cluster, job_id_raw, submit_at)
                REFERENCES job_attempt (cluster, job_id_raw, submit_at) ON DELETE CASCADE
        )
        """
    )
    op.execute("CREATE INDEX gpu_attribution_day ON gpu_attribution (day, node)")
    op.execute("CREATE INDEX gpu_attribution_gpu ON gpu_attribution (gpu_uuid, day)")
    # telemetry batches attribution has folded in (a batch is processed once, whenever it commits)
    op.execute(
        """
        CREATE TABLE attribution_batch (
            batch_id bigint PRIMARY KEY REFERENCES ingest_batch (id) ON DELETE CASCADE,
            processed_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE attribution_watermark (
            name text PRIMARY KEY,
            value_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE attribution_watermark")
    op.execute("DROP TABLE attribution_batch")
    op.execute("DROP TABLE gpu_attribution")
