"""each packed hour keeps its highest window power (issue 28)

Revision ID: 0026
Revises: 0025

- gpu_window_hour.power_max_deciwatts: the highest of the row's power_mean_deciwatts (NULL
  when it has none), a stored generated column, so that it is the array's maximum however
  the row was written or changed. `slurmtel job`'s highest window power
  (slurmtel.store.samples.power_max_sql) reads it for an hour the job holds whole, and for an
  hour at the job's edges checks the windows only when the hour holds more than the rest of
  the job: it unpacked every window of every hour of the job before.
- slurmtel_smallint_max(smallint[]): the maximum of an array (immutable, for the column).

Adding the column rewrites gpu_window_hour once (its partitions, under an exclusive lock):
about as long as reading it through.
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION slurmtel_smallint_max(a smallint[]) RETURNS smallint
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT max(x) FROM unnest(a) AS x $$
        """
    )
    op.execute(
        """
        ALTER TABLE gpu_window_hour ADD COLUMN power_max_deciwatts smallint
        GENERATED ALWAYS AS (slurmtel_smallint_max(power_mean_deciwatts)) STORED
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE gpu_window_hour DROP COLUMN power_max_deciwatts")
    op.execute("DROP FUNCTION slurmtel_smallint_max(smallint[])")
