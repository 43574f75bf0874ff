"""gpu_job_span: when each job's processes were seen on each GPU (per hour), for attribution

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Derived from gpu_summary.job_ids by the attribution run, one row per GPU, job and hour:
    # finding the GPUs a job's processes ran on then reads this small table instead of every
    # window of every GPU of the job's nodes. Kept when raw summaries pass their retention.
    op.execute(
        """
        CREATE TABLE gpu_job_span (
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            job_id text NOT NULL,
            hour timestamptz NOT NULL,
            first_at timestamptz NOT NULL,
            last_at timestamptz NOT NULL,
            PRIMARY KEY (gpu_uuid, job_id, hour)
        )
        """
    )
    op.execute("CREATE INDEX gpu_job_span_job ON gpu_job_span (job_id, node, first_at)")


def downgrade() -> None:
    op.execute("DROP TABLE gpu_job_span")
