"""host data stored after the GPU windows it describes marks attempts for recomputation

Revision ID: 0025
Revises: 0024

- host_batch: one row per write of host data (job cgroup windows, GPU throttle windows, node
  file system windows, Lustre jobstats snapshots) that no GPU ingest batch of the same
  transaction covers: the node ('' for any: Lustre is per job, all nodes), the job id (NULL for
  node-level data: every job on the node) and the span of windows it changes. The next
  attribution run marks the attempts it overlaps dirty from window_min_at on, as it does for a
  GPU ingest batch, and deletes the rows it folded in. Belongs to no user: readable like
  ingest_batch.
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE host_batch (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source text NOT NULL,
            node text NOT NULL,
            job_id text,
            window_min_at timestamptz NOT NULL,
            window_max_at timestamptz NOT NULL,
            ingested_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON host_batch TO {WRITER}")
    op.execute(f"GRANT SELECT ON host_batch TO {READER}")


def downgrade() -> None:
    op.execute("DROP TABLE host_batch")
