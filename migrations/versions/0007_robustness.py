"""robustness: when each attempt's stored view was captured; runs left running by a kill

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # When the sacct output an attempt's row was last written from was taken (the call's
    # time; a saved file's modification time; NULL when unknown). The upsert lets a view
    # replace the stored one only when it is not behind it (slurmtel.store.jobs: the newest
    # state wins); between views of the same progress, the later capture wins.
    op.execute("ALTER TABLE job_attempt ADD COLUMN captured_at timestamptz")
    # every run start looks for runs left 'running' by a process that died
    op.execute("CREATE INDEX collect_run_running ON collect_run (id) WHERE status = 'running'")


def downgrade() -> None:
    op.execute("DROP INDEX collect_run_running")
    op.execute("UPDATE collect_run SET status = 'error' WHERE status = 'interrupted'")
    op.execute("ALTER TABLE job_attempt DROP COLUMN captured_at")
