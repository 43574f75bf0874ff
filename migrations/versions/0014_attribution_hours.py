"""attribution hours: raw partial sums per attempt x GPU x hour slice, and each attempt's progress

Revision ID: 0014
Revises: 0013

An attribution run recomputed a running attempt's current day from all that day's windows, so
its cost grew with the hour of the day. Now (slurmtel.store.attribution.recompute_dirty):

- gpu_attribution_part: one row per attempt x node x GPU x slice. A slice is a UTC hour cut
  at the site's day boundaries (a zone with a half-hour offset cuts an hour in two), so slices
  nest in both the UTC hours and the site days. A row holds the unclamped sums of the windows
  overlapping the slice inside the attempt (each window by the fraction of it in the slice, as
  day boundaries split windows) and their maxima; a slice without such windows has no row.
- attribution_progress: per attempt, what its parts were computed for: the end they were
  computed to (the attempt's end, or the run's `now` while it runs), its start, nodes, GPU
  count and the site time zone. A run keeps the slices that end before the earliest of that
  end, the attempt's end now and the first new telemetry on its nodes; it recomputes the later
  slices and rebuilds the gpu_attribution rows of their days from the slices, with the clamps
  applied to the day sums. A full run recomputes every slice the same way.

Both are internal to the attribution run: row security lets the writer see every row and the
reader only with a scope of everything (as gpu_job_span). Deleted with their attempt.
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE gpu_attribution_part (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            node text NOT NULL,
            gpu_uuid text NOT NULL,
            day date NOT NULL,  -- the site day the slice is in
            hour_at timestamptz NOT NULL,  -- the UTC hour the slice is in
            windows integer NOT NULL,  -- windows read (overlapping the slice)
            util_metric text NOT NULL,
            covered_seconds double precision NOT NULL,
            idle_seconds double precision NOT NULL,
            no_process_seconds double precision NOT NULL,
            util_weighted_sum double precision NOT NULL,
            util_max_percent real,
            memory_used_max_bytes bigint,
            energy_joules double precision,
            -- day before node and GPU: a run reads an attempt's slices from a day on
            PRIMARY KEY (cluster, job_id_raw, submit_at, day, node, gpu_uuid, hour_at),
            FOREIGN KEY (cluster, job_id_raw, submit_at)
                REFERENCES job_attempt (cluster, job_id_raw, submit_at) ON DELETE CASCADE
        )
        """
    )
    op.execute(
        """
        CREATE TABLE attribution_progress (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            computed_to timestamptz NOT NULL,
            start_at timestamptz NOT NULL,
            nodes text[] NOT NULL,
            alloc_gpus integer NOT NULL,
            timezone text NOT NULL,
            PRIMARY KEY (cluster, job_id_raw, submit_at),
            FOREIGN KEY (cluster, job_id_raw, submit_at)
                REFERENCES job_attempt (cluster, job_id_raw, submit_at) ON DELETE CASCADE
        )
        """
    )
    scope_all = "coalesce(current_setting('slurmtel.scope_all', true), '') = 'on'"
    for table in ("gpu_attribution_part", "attribution_progress"):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {WRITER}")
        op.execute(f"GRANT SELECT ON {table} TO {READER}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY writer_all ON {table} TO {WRITER} USING (true) WITH CHECK (true)")
        op.execute(f"CREATE POLICY reader_scope ON {table} FOR SELECT TO {READER} USING ({scope_all})")


def downgrade() -> None:
    op.execute("DROP TABLE attribution_progress")
    op.execute("DROP TABLE gpu_attribution_part")
