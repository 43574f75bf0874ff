"""packed windows: recent windows one row each, closed hours packed one row per GPU and hour

Revision ID: 0012
Revises: 0011

A row per 30 s window cost about 280-410 bytes with its indexes. Windows now live in two
tables, both partitioned by UTC day:

- gpu_window (the former gpu_summary, renamed with its partitions): one row per window, as
  ingest writes them with COPY. It holds the hours not packed yet.
- gpu_window_hour: one row per GPU, source, hour and shape (node, window length, utilisation
  metric, energy method, memory size), its windows as parallel arrays of narrow types, and no
  per-window index. The attribution run moves closed hours it has folded in from gpu_window to
  here (slurmtel.store.telemetry.pack_windows).

Narrow types, and what they keep (a window with a value they cannot hold stays unpacked):
offsets from the hour in ms (only the first, when the windows follow each other); utilisation in 1/100 percent; covered, idle and no-process time
in 1/30000 of the window (1 ms of a 30 s window); memory in KiB; power in 1/10 W; temperature
in 1/10 degree; SM clock in MHz; energy as real; the job ids of a window as an index into the
row's distinct job-id sets.

gpu_summary is now a view of both (every window, as before). Attribution and `slurmtel job` read
windows through two functions only: slurmtel_gpu_windows(uuids, lo, hi), the windows of some
GPUs overlapping [lo, hi), and slurmtel_batch_windows(batch_ids, lo, hi), the windows of some
ingest batches; another sample store (slurmtel.store.samples) replaces them and the writer, not
attribution.
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

WRITER = "slurmtel_writer"  # migration 0010's role of the daemon
# 1/30000 of a window: covered, idle and no-process seconds (an int2 holds up to 1.09 windows)
PARTS = 30000
# separates the job ids of one window inside a job set (the ingest refuses an id holding it)
JOB_SEPARATOR = "chr(31)"

_PACKED = """
    CREATE TABLE gpu_window_hour (
        source text NOT NULL,
        node text NOT NULL,
        gpu_uuid text NOT NULL,
        hour_at timestamptz NOT NULL,
        window_seconds real NOT NULL,
        util_metric text NOT NULL,
        energy_method text NOT NULL,
        memory_total_bytes bigint NOT NULL,  -- -1: not known
        batch_id bigint NOT NULL,  -- the newest batch among its windows
        job_sets text[] NOT NULL,  -- distinct job-id sets of its windows, ids joined by chr(31)
        first_offset_ms integer NOT NULL,
        -- NULL when the windows follow each other without a gap from first_offset_ms (the
        -- common case: an offset would cost 4 of the 30-odd bytes of a window)
        window_offsets_ms integer[],
        sample_counts integer[] NOT NULL,
        covered_parts smallint[] NOT NULL,
        idle_parts smallint[] NOT NULL,
        no_process_parts smallint[] NOT NULL,
        util_mean_centipercents smallint[] NOT NULL,
        util_max_centipercents smallint[] NOT NULL,
        memory_used_mean_kib integer[] NOT NULL,
        memory_used_max_kib integer[] NOT NULL,
        power_mean_deciwatts smallint[] NOT NULL,
        energy_joules real[] NOT NULL,
        temperature_max_decicelsius smallint[] NOT NULL,
        sm_clock_max_mhz smallint[] NOT NULL,
        job_set_numbers smallint[] NOT NULL,  -- 0: no job; n: job_sets[n]
        UNIQUE (gpu_uuid, hour_at, source, node, window_seconds, util_metric, energy_method,
                memory_total_bytes)
    ) PARTITION BY RANGE (hour_at)
"""

# every window of one packed row H, as a gpu_window row
_UNPACK_FUNCTION = f"""
    CREATE FUNCTION slurmtel_unpack_windows(h gpu_window_hour) RETURNS SETOF gpu_window
    LANGUAGE sql IMMUTABLE AS $$
        SELECT h.source, h.node, h.gpu_uuid,
               h.hour_at + coalesce(w.offset_ms, h.first_offset_ms + (w.n - 1) * CAST(round(h.window_seconds * 1000) AS integer))
                           * interval '1 millisecond',
               h.window_seconds, h.util_metric, w.sample_count,
               CAST(w.covered * h.window_seconds / {PARTS} AS real),
               CAST(w.util_mean / 100.0 AS real), CAST(w.util_max / 100.0 AS real),
               CAST(w.idle * h.window_seconds / {PARTS} AS real),
               CAST(w.no_process * h.window_seconds / {PARTS} AS real),
               w.memory_mean * CAST(1024 AS bigint), w.memory_max * CAST(1024 AS bigint),
               nullif(h.memory_total_bytes, -1), CAST(w.power / 10.0 AS real),
               CAST(w.energy AS double precision), h.energy_method,
               CAST(w.temperature / 10.0 AS real), CAST(w.sm_clock AS real),
               CASE WHEN w.job_set = 0 THEN CAST('{{}}' AS text[])
                    ELSE string_to_array(h.job_sets[w.job_set], {JOB_SEPARATOR}) END,
               h.batch_id
        FROM unnest(h.window_offsets_ms, h.sample_counts, h.covered_parts, h.idle_parts,
            h.no_process_parts, h.util_mean_centipercents, h.util_max_centipercents,
            h.memory_used_mean_kib, h.memory_used_max_kib, h.power_mean_deciwatts, h.energy_joules,
            h.temperature_max_decicelsius, h.sm_clock_max_mhz, h.job_set_numbers) WITH ORDINALITY
            AS w(offset_ms, sample_count, covered, idle, no_process, util_mean, util_max, memory_mean,
                 memory_max, power, energy, temperature, sm_clock, job_set, n)
    $$
"""

# whether packed row H holds the window that starts OFFSET_MS after its hour (the writer's
# check that a retried window is not stored twice)
_HOLDS_FUNCTION = """
    CREATE FUNCTION slurmtel_packed_holds(h gpu_window_hour, offset_ms integer) RETURNS boolean
    LANGUAGE sql IMMUTABLE AS $$
        SELECT CASE WHEN h.window_offsets_ms IS NULL
                    THEN offset_ms >= h.first_offset_ms
                         AND (offset_ms - h.first_offset_ms) % CAST(round(h.window_seconds * 1000) AS integer) = 0
                         AND (offset_ms - h.first_offset_ms) / CAST(round(h.window_seconds * 1000) AS integer)
                             < cardinality(h.sample_counts)
                    ELSE offset_ms = ANY (h.window_offsets_ms) END
    $$
"""

_VIEW = """
    CREATE VIEW gpu_summary WITH (security_invoker = true) AS
    SELECT * FROM gpu_window
    UNION ALL
    SELECT w.* FROM gpu_window_hour h CROSS JOIN LATERAL slurmtel_unpack_windows(h) w
"""

# The windows of UUIDS that overlap [LO, HI), recent and packed (windows are at most an hour
# long, so both tables are read through their keys from an hour before LO). LANGUAGE sql and
# STABLE: inlined into the calling query like a subquery.
_WINDOWS_FUNCTION = """
    CREATE FUNCTION slurmtel_gpu_windows(uuids text[], lo timestamptz, hi timestamptz)
    RETURNS SETOF gpu_window LANGUAGE sql STABLE AS $$
        SELECT * FROM gpu_window
        WHERE gpu_uuid = ANY (uuids)
          AND window_start_at >= lo - interval '1 hour' AND window_start_at < hi
          AND window_start_at + make_interval(secs => window_seconds) > lo
        UNION ALL
        SELECT w.* FROM gpu_window_hour h CROSS JOIN LATERAL slurmtel_unpack_windows(h) w
        WHERE h.gpu_uuid = ANY (uuids)
          AND h.hour_at >= lo - interval '2 hours' AND h.hour_at < hi
          AND w.window_start_at >= lo - interval '1 hour' AND w.window_start_at < hi
          AND w.window_start_at + make_interval(secs => w.window_seconds) > lo
    $$
"""

# The windows written by the ingest batches BATCH_IDS (every window when NULL) that start in
# [LO, HI): what the attribution run reads the job ids of new windows from.
_BATCH_WINDOWS_FUNCTION = """
    CREATE FUNCTION slurmtel_batch_windows(batch_ids bigint[], lo timestamptz, hi timestamptz)
    RETURNS SETOF gpu_window LANGUAGE sql STABLE AS $$
        SELECT * FROM gpu_window
        WHERE (batch_ids IS NULL OR batch_id = ANY (batch_ids)) AND window_start_at >= lo AND window_start_at < hi
        UNION ALL
        SELECT w.* FROM gpu_window_hour h CROSS JOIN LATERAL slurmtel_unpack_windows(h) w
        WHERE (batch_ids IS NULL OR h.batch_id = ANY (batch_ids))
          AND h.hour_at >= lo - interval '1 hour' AND h.hour_at < hi
          AND w.window_start_at >= lo AND w.window_start_at < hi
    $$
"""

_PARTITION_FUNCTIONS = """
    -- the daily partitions of gpu_window and gpu_window_hour for DAY (UTC), named as
    -- slurmtel.store.telemetry names them; true when they were made now
    CREATE OR REPLACE FUNCTION slurmtel_create_summary_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    DECLARE
        name text := 'gpu_window_' || to_char(day, 'YYYYMMDD');
        packed text := 'gpu_window_hour_' || to_char(day, 'YYYYMMDD');
        lo timestamptz := CAST(day AS timestamp) AT TIME ZONE 'UTC';
        made boolean := false;
    BEGIN
        IF to_regclass(name) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF gpu_window FOR VALUES FROM (%L) TO (%L)',
                           name, lo, lo + interval '1 day');
            made := true;
        END IF;
        IF to_regclass(packed) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF gpu_window_hour FOR VALUES FROM (%L) TO (%L)',
                           packed, lo, lo + interval '1 day');
            -- try to compress any row of more than 128 bytes (the default waits for 2 kB)
            EXECUTE format('ALTER TABLE %I SET (toast_tuple_target = 128)', packed);
        END IF;
        RETURN made;
    END $$;
    -- drops only the partitions of gpu_window and gpu_window_hour, never another table
    CREATE OR REPLACE FUNCTION slurmtel_drop_summary_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    DECLARE
        name text := 'gpu_window_' || to_char(day, 'YYYYMMDD');
        packed text := 'gpu_window_hour_' || to_char(day, 'YYYYMMDD');
        dropped boolean := false;
    BEGIN
        IF EXISTS (SELECT 1 FROM pg_inherits
                   WHERE inhparent = 'gpu_window_hour'::regclass AND inhrelid = to_regclass(packed)) THEN
            EXECUTE format('DROP TABLE %I', packed);
        END IF;
        IF EXISTS (SELECT 1 FROM pg_inherits
                   WHERE inhparent = 'gpu_window'::regclass AND inhrelid = to_regclass(name)) THEN
            EXECUTE format('DROP TABLE %I', name);
            dropped := true;
        END IF;
        RETURN dropped;
    END $$;
"""

# Once every window of a day is packed, its gpu_window partition is empty but its indexes keep
# their pages; TRUNCATE gives them back. SECURITY DEFINER like the partition functions (the
# writer owns no table), and only that: an empty partition of gpu_window, nothing else.
_RECLAIM_FUNCTION = f"""
    CREATE FUNCTION slurmtel_reclaim_window_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    DECLARE
        name text := 'gpu_window_' || to_char(day, 'YYYYMMDD');
        empty boolean;
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_inherits
                       WHERE inhparent = 'gpu_window'::regclass AND inhrelid = to_regclass(name))
           OR pg_total_relation_size(to_regclass(name)) <= 4 * 8192 THEN
            RETURN false;
        END IF;
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', name) INTO empty;
        IF empty THEN
            EXECUTE format('TRUNCATE %I', name);
        END IF;
        RETURN empty;
    END $$;
    REVOKE ALL ON FUNCTION slurmtel_reclaim_window_partition(date) FROM PUBLIC;
    GRANT EXECUTE ON FUNCTION slurmtel_reclaim_window_partition(date) TO {WRITER};
"""

# migration 0010's functions, for the downgrade
_OLD_PARTITION_FUNCTIONS = """
    CREATE OR REPLACE FUNCTION slurmtel_create_summary_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    DECLARE
        name text := 'gpu_summary_' || to_char(day, 'YYYYMMDD');
        lo timestamptz := CAST(day AS timestamp) AT TIME ZONE 'UTC';
    BEGIN
        IF to_regclass(name) IS NOT NULL THEN
            RETURN false;
        END IF;
        EXECUTE format('CREATE TABLE %I PARTITION OF gpu_summary FOR VALUES FROM (%L) TO (%L)',
                       name, lo, lo + interval '1 day');
        RETURN true;
    END $$;
    CREATE OR REPLACE FUNCTION slurmtel_drop_summary_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    DECLARE
        name text := 'gpu_summary_' || to_char(day, 'YYYYMMDD');
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_inherits
                       WHERE inhparent = 'gpu_summary'::regclass AND inhrelid = to_regclass(name)) THEN
            RETURN false;
        END IF;
        EXECUTE format('DROP TABLE %I', name);
        RETURN true;
    END $$;
"""

# lz4 where the server has it (compresses and reads faster than pglz); pglz otherwise
_LZ4 = """
    DO $$
    DECLARE c text;
    BEGIN
        FOREACH c IN ARRAY ARRAY['job_sets', 'window_offsets_ms', 'sample_counts', 'covered_parts',
            'idle_parts', 'no_process_parts', 'util_mean_centipercents', 'util_max_centipercents',
            'memory_used_mean_kib', 'memory_used_max_kib', 'power_mean_deciwatts', 'energy_joules',
            'temperature_max_decicelsius', 'sm_clock_max_mhz', 'job_set_numbers'] LOOP
            EXECUTE format('ALTER TABLE gpu_window_hour ALTER COLUMN %I SET COMPRESSION lz4', c);
        END LOOP;
    EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
        NULL;
    END $$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE gpu_summary RENAME TO gpu_window")
    op.execute("ALTER INDEX gpu_summary_pkey RENAME TO gpu_window_pkey")
    op.execute("ALTER INDEX gpu_summary_node_window RENAME TO gpu_window_node_window")
    op.execute("ALTER INDEX gpu_summary_batch RENAME TO gpu_window_batch")
    op.execute(
        """
        DO $$
        DECLARE part text;
        BEGIN
            FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                        WHERE i.inhparent = 'gpu_window'::regclass LOOP
                EXECUTE format('ALTER TABLE %I RENAME TO %I', part,
                               'gpu_window_' || right(part, 8));
            END LOOP;
        END $$
        """
    )
    op.execute(_PACKED)
    op.execute("CREATE INDEX gpu_window_hour_batch ON gpu_window_hour (batch_id)")
    op.execute(_LZ4)
    op.execute(_PARTITION_FUNCTIONS)
    op.execute(_RECLAIM_FUNCTION)
    # the packed partitions of the days that have windows already
    op.execute(
        """
        SELECT slurmtel_create_summary_partition(CAST(right(c.relname, 8) AS date))
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'gpu_window'::regclass
        """
    )
    op.execute(_UNPACK_FUNCTION)
    op.execute(_HOLDS_FUNCTION)
    op.execute(_VIEW)
    op.execute(_WINDOWS_FUNCTION)
    op.execute(_BATCH_WINDOWS_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION slurmtel_gpu_windows(text[], timestamptz, timestamptz)")
    op.execute("DROP FUNCTION slurmtel_batch_windows(bigint[], timestamptz, timestamptz)")
    op.execute("DROP FUNCTION slurmtel_reclaim_window_partition(date)")
    op.execute("DROP VIEW gpu_summary")
    # packed windows go back to one row each
    op.execute(
        "INSERT INTO gpu_window SELECT w.* FROM gpu_window_hour h "
        "CROSS JOIN LATERAL slurmtel_unpack_windows(h) w ON CONFLICT DO NOTHING"
    )
    op.execute("DROP FUNCTION slurmtel_unpack_windows(gpu_window_hour)")
    op.execute("DROP FUNCTION slurmtel_packed_holds(gpu_window_hour, integer)")
    op.execute("DROP TABLE gpu_window_hour")
    op.execute(
        """
        DO $$
        DECLARE part text;
        BEGIN
            FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                        WHERE i.inhparent = 'gpu_window'::regclass LOOP
                EXECUTE format('ALTER TABLE %I RENAME TO %I', part, 'gpu_summary_' || right(part, 8));
            END LOOP;
        END $$
        """
    )
    op.execute("ALTER INDEX gpu_window_pkey RENAME TO gpu_summary_pkey")
    op.execute("ALTER INDEX gpu_window_node_window RENAME TO gpu_summary_node_window")
    op.execute("ALTER INDEX gpu_window_batch RENAME TO gpu_summary_batch")
    op.execute("ALTER TABLE gpu_window RENAME TO gpu_summary")
    op.execute(_OLD_PARTITION_FUNCTIONS)
