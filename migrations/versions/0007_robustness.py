"""robustness: when each attempt's stored view was captured; db_index beyond bigint; runs left running by a kill

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
    # time; NULL when unknown, a saved file). The upsert lets a view replace the stored one
    # only when it is not behind it (slurmtel.store.jobs: the newest state wins); between
    # views that have come as far, the later capture wins.
    op.execute("ALTER TABLE job_attempt ADD COLUMN captured_at timestamptz")
    # the view lists the table's columns as they were when it was made: made again around
    # the change of db_index's type (below), it shows captured_at too
    op.execute("DROP VIEW job_attempt_outcome")
    # slurmdbd's job_db_inx is an unsigned 64-bit number, and from 24.11 on sacct prints values
    # beyond bigint (10522248147561946112): numeric holds every one exactly
    op.execute("ALTER TABLE job_attempt ALTER COLUMN db_index TYPE numeric(20, 0)")
    _create_outcome_view()
    # every run start looks for runs left 'running' by a process that died
    op.execute("CREATE INDEX collect_run_running ON collect_run (id) WHERE status = 'running'")


def _create_outcome_view() -> None:
    # as 0001 made it: attempts with their outcome class; states the config does not list are 'unknown'
    op.execute(
        """
        CREATE VIEW job_attempt_outcome AS
        SELECT a.*, coalesce(o.outcome, 'unknown') AS outcome
        FROM job_attempt a LEFT JOIN outcome_class o ON o.state = a.state
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX collect_run_running")
    op.execute("UPDATE collect_run SET status = 'error' WHERE status = 'interrupted'")
    op.execute("DROP VIEW job_attempt_outcome")
    op.execute("ALTER TABLE job_attempt DROP COLUMN captured_at")
    op.execute(
        "ALTER TABLE job_attempt ALTER COLUMN db_index TYPE bigint "
        "USING CASE WHEN db_index < 9223372036854775808 THEN db_index END"
    )
    _create_outcome_view()
