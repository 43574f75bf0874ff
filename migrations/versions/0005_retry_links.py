"""retry links: resubmission links materialised by the attribution run

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One row per resubmission: the job (cluster, job_id_raw, job_submit_at) and the failed job
    # it follows (slurmtel.store.attribution has the rules). Each job follows at most one
    # failed job and each failed job has at most one resubmission, so both ends are unique.
    # Both jobs share the chain key (user, account, partition, name), kept here so that reports
    # can scope and filter links without reading the attempts, and so that the next run finds
    # the neighbourhood a link was in after its jobs changed. No foreign key: a job is not a
    # row of job_attempt (its attempts are); the attribution run replaces stale links.
    op.execute(
        """
        CREATE TABLE retry_link (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            job_submit_at timestamptz NOT NULL,
            prev_job_id_raw bigint NOT NULL,
            prev_job_submit_at timestamptz NOT NULL,
            prev_end_at timestamptz NOT NULL,
            user_name text NOT NULL,
            account text NOT NULL,
            partition text NOT NULL,
            name text NOT NULL,
            computed_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (cluster, job_id_raw, job_submit_at),
            CONSTRAINT retry_link_one_resubmission UNIQUE (cluster, prev_job_id_raw, prev_job_submit_at),
            CONSTRAINT retry_link_in_window CHECK (job_submit_at >= prev_end_at)
        )
        """
    )
    op.execute("CREATE INDEX retry_link_submit ON retry_link (job_submit_at)")
    # What the links were computed with: the resubmission window and the states classed as
    # failed then. Reports read retry_link only while both equal the current ones; an
    # attribution run that finds them changed recomputes every link. At most one row.
    op.execute(
        """
        CREATE TABLE retry_link_state (
            singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
            window_seconds integer NOT NULL,
            failed_states text[] NOT NULL,
            computed_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE retry_link_state")
    op.execute("DROP TABLE retry_link")
