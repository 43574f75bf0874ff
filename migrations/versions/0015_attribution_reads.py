"""attribution reads: gpu_inventory by GPU UUID; packed hours read from the first that can hold a window

Revision ID: 0015
Revises: 0014

Two reads of every attribution run, measured at 10,000 GPUs (benchmarks/scale.py, docs/scale.md):

- The run takes each mapped GPU's fraction (a MIG slice's share of its GPU) from the GPU's
  latest inventory row, and `slurmtel job` takes its model and memory the same way: a lookup by
  gpu_uuid, which no index led with. Each lookup scanned the whole inventory: 0.6 ms for each of
  the 11,000 mapped GPUs of a run, 5 s of it. Now an index.
- slurmtel_gpu_windows(uuids, lo, hi) unpacked the packed hours from the one starting 2 hours
  before LO. A window is at most an hour long (slurmtel.store.telemetry.MAX_WINDOW_SECONDS), so
  no window of that hour reaches LO: every run from the third hour of a day on unpacked a whole
  hour of every running GPU for nothing, about 1.5 s a run. Now from the next hour on.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# The windows of UUIDS that overlap [LO, HI), recent and packed. A window is at most an hour
# long, so it starts after LO - 1 hour, and its packed hour starts after LO - 2 hours.
_WINDOWS_FUNCTION = """
    CREATE OR REPLACE FUNCTION slurmtel_gpu_windows(uuids text[], lo timestamptz, hi timestamptz)
    RETURNS SETOF gpu_window LANGUAGE sql STABLE AS $$
        SELECT * FROM gpu_window
        WHERE gpu_uuid = ANY (uuids)
          AND window_start_at >= lo - interval '1 hour' AND window_start_at < hi
          AND window_start_at + make_interval(secs => window_seconds) > lo
        UNION ALL
        SELECT w.* FROM gpu_window_hour h CROSS JOIN LATERAL slurmtel_unpack_windows(h) w
        WHERE h.gpu_uuid = ANY (uuids)
          AND h.hour_at > lo - interval '2 hours' AND h.hour_at < hi
          AND w.window_start_at >= lo - interval '1 hour' AND w.window_start_at < hi
          AND w.window_start_at + make_interval(secs => w.window_seconds) > lo
    $$
"""


def upgrade() -> None:
    op.execute("CREATE INDEX gpu_inventory_uuid ON gpu_inventory (gpu_uuid, last_seen_at)")
    op.execute(_WINDOWS_FUNCTION)


def downgrade() -> None:
    op.execute(
        _WINDOWS_FUNCTION.replace(
            "h.hour_at > lo - interval '2 hours'", "h.hour_at >= lo - interval '2 hours'"
        )
    )
    op.execute("DROP INDEX gpu_inventory_uuid")
