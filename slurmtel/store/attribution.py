"""Attribution SQL: which GPU each attempt held, and what each of those GPUs did meanwhile.

An attribution run recomputes the `gpu_attribution` rows of the attempts that may have
changed ("dirty"): attempts written since the job watermark, attempts still running, attempts
whose GPU allocations were seen since the allocation watermark, and attempts overlapping a
telemetry batch that no run has folded in yet, and attempts overlapping host data stored after
its GPU windows (a host batch, slurmtel.store.hostside: the idle causes read it). Of those it recomputes the hour slices that can
have changed and rebuilds their days' rows from the slices (recompute_dirty), so a run is
idempotent, gives the rows a full recompute gives, and late data is absorbed by the run after
it arrives.

GPU <-> job mapping, in order of trust (DESIGN §6): GPUs on which the node agent saw the job's
processes (gpu_job_span: per GPU, job and hour, kept up to date from each run's new telemetry
batches, so a run does not read every window of every GPU of a job's nodes); GPU indices slurmctld showed while the job ran (translated to UUIDs); every GPU of a
node the attempt held entirely. Allocation no GPU can be mapped to stays 'unmapped' (counted
as unmeasured), never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from slurmtel.store.telemetry import utc_hour
from slurmtel.vocabulary import IDLE_CAUSES


@dataclass(frozen=True)
class DirtySelection:
    attempts: int
    batches: list[int]
    # the new batches' windows start in [lo, hi); None when there are no new batches
    batch_window: tuple[datetime, datetime] | None
    max_updated_at: datetime | None
    max_allocation_seen_at: datetime | None
    # host batches (host_batch) folded in: deleted once the run has recomputed what they overlap
    host_batches: tuple[int, ...] = ()


def get_watermark(conn: Connection, name: str) -> datetime | None:
    return conn.execute(
        text("SELECT value_at FROM attribution_watermark WHERE name = :name"), {"name": name}
    ).scalar_one_or_none()


def set_watermark(conn: Connection, name: str, value: datetime) -> None:
    conn.execute(
        text(
            "INSERT INTO attribution_watermark (name, value_at) VALUES (:name, :value) "
            "ON CONFLICT (name) DO UPDATE SET value_at = greatest(attribution_watermark.value_at, "
            "EXCLUDED.value_at), updated_at = now()"
        ),
        {"name": name, "value": value},
    )


def select_dirty_attempts(
    conn: Connection,
    *,
    now: datetime,
    job_mark: datetime | None,
    allocation_mark: datetime | None,
    overlap_seconds: int,
    everything: bool = False,
) -> DirtySelection:
    """Fill the temp table dirty_attempt for this transaction and return what was selected."""
    conn.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS new_batch "
            "(id bigint, node text, lo timestamptz, hi timestamptz) ON COMMIT DELETE ROWS"
        )
    )
    conn.execute(text("TRUNCATE new_batch"))
    conn.execute(
        text(
            """
            INSERT INTO new_batch
            SELECT b.id, b.node, b.window_min_at, b.window_max_at + interval '1 hour'
            FROM ingest_batch b
            WHERE b.window_min_at IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM attribution_batch p WHERE p.batch_id = b.id)
            """
        )
    )
    ids, lo, hi = conn.execute(
        text("SELECT array_agg(id ORDER BY id), min(lo), max(hi) FROM new_batch")
    ).one()
    batches = [int(b) for b in ids or ()]
    # host data stored after the GPU windows it describes (job_id NULL: every job on the node;
    # node '': every node of the job)
    conn.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS new_host_batch "
            "(id bigint, node text, job_id text, lo timestamptz, hi timestamptz) ON COMMIT DELETE ROWS"
        )
    )
    conn.execute(text("TRUNCATE new_host_batch"))
    host_ids = conn.execute(
        text(
            "INSERT INTO new_host_batch SELECT id, node, job_id, window_min_at, window_max_at FROM host_batch "
            "RETURNING id"
        )
    ).scalars()
    host_batches = tuple(sorted(int(h) for h in host_ids))
    conn.execute(
        text(
            """
            CREATE TEMP TABLE IF NOT EXISTS dirty_attempt (
                cluster text, job_id_raw bigint, submit_at timestamptz, start_at timestamptz,
                end_eff timestamptz, nodes text[], alloc_gpus integer,
                -- recompute_dirty recomputes its slices from from_at on and its day rows from
                -- from_day (from_at's site day) on; all of them when NULL
                from_at timestamptz, from_day date,
                -- set when the slices holding from_at end their windows by from_at: they are
                -- kept and only the windows from append_from (= from_at) on are added to them
                append_from timestamptz,
                PRIMARY KEY (cluster, job_id_raw, submit_at)
            ) ON COMMIT DELETE ROWS
            """
        )
    )
    conn.execute(text("TRUNCATE dirty_attempt"))
    params = {
        "now": now,
        "job_mark": job_mark,
        "alloc_mark": allocation_mark,
        "overlap": f"{int(overlap_seconds)} seconds",
        "everything": everything,
    }
    count = conn.execute(
        text(
            """
            INSERT INTO dirty_attempt
            SELECT a.cluster, a.job_id_raw, a.submit_at, a.start_at,
                   least(coalesce(a.end_at, CAST(:now AS timestamptz)), CAST(:now AS timestamptz)),
                   a.nodes, a.alloc_gpus, NULL, NULL, NULL
            FROM job_attempt a
            WHERE a.start_at IS NOT NULL AND a.alloc_gpus > 0
              AND a.start_at < CAST(:now AS timestamptz)
              AND coalesce(a.end_at, CAST(:now AS timestamptz)) > a.start_at
              AND cardinality(a.nodes) > 0
              AND (
                CAST(:everything AS boolean)
                OR a.end_at IS NULL
                OR CAST(:job_mark AS timestamptz) IS NULL
                OR a.updated_at > CAST(:job_mark AS timestamptz) - CAST(:overlap AS interval)
                OR EXISTS (
                    SELECT 1 FROM new_batch b
                    WHERE (b.node = '' OR b.node = ANY (a.nodes))
                      AND b.lo < coalesce(a.end_at, CAST(:now AS timestamptz)) AND b.hi > a.start_at
                )
                OR EXISTS (
                    SELECT 1 FROM new_host_batch h
                    WHERE (h.node = '' OR h.node = ANY (a.nodes))
                      AND (h.job_id IS NULL OR h.job_id = CAST(a.job_id_raw AS text))
                      AND h.lo < coalesce(a.end_at, CAST(:now AS timestamptz)) AND h.hi > a.start_at
                )
                OR EXISTS (
                    SELECT 1 FROM gpu_allocation g
                    WHERE g.cluster = a.cluster AND g.job_id_raw = a.job_id_raw AND g.submit_at = a.submit_at
                      AND (CAST(:alloc_mark AS timestamptz) IS NULL
                           OR g.last_seen_at > CAST(:alloc_mark AS timestamptz) - CAST(:overlap AS interval))
                )
              )
            """
        ),
        params,
    ).rowcount
    marks = conn.execute(
        text(
            "SELECT (SELECT max(updated_at) FROM job_attempt), (SELECT max(last_seen_at) FROM gpu_allocation)"
        )
    ).one()
    return DirtySelection(
        int(count or 0), batches, (lo, hi) if batches else None, marks[0], marks[1], host_batches
    )


@dataclass(frozen=True)
class Recomputed:
    rows: int  # gpu_attribution rows written (rows whose values did not change are kept)
    slices: int  # gpu_attribution_part rows written
    windows: int  # windows read into them


# the columns of a gpu_attribution row a run computes (computed_at is when it was written)
_ROW_VALUES = (
    "mapping, gpu_fraction, util_metric, allocated_seconds, covered_seconds, busy_seconds, idle_seconds, "
    "no_process_seconds, unmeasured_seconds, util_weighted_sum, util_max_percent, memory_used_max_bytes, "
    "energy_joules"
)
_ROW_KEY = ("cluster", "job_id_raw", "submit_at", "node", "gpu_uuid", "day")


def recompute_dirty(
    conn: Connection,
    *,
    timezone: str,
    full: bool = False,
    before_read: Callable[[Connection], object] | None = None,
    causes: CauseThresholds | None = None,
) -> Recomputed:
    """Bring the gpu_attribution rows of every attempt in dirty_attempt up to date.

    Two grains (migration 0014): gpu_attribution_part holds per attempt x node x GPU x slice
    (a UTC hour cut at the site's day boundaries) the unclamped sums and maxima of the windows
    overlapping the slice; gpu_attribution's day rows are built from them, the clamps applied
    to the day sums. attribution_progress records per attempt the end its slices were computed
    to (its end, or `now` while it runs) and its start, nodes, GPU count and time zone.

    An attempt whose start, nodes, GPU count and time zone are those of its progress and whose
    GPU mapping is that of its stored rows keeps its slices that end by from_at: the earliest
    of the end they were computed to, its end now, and the first window of a new telemetry
    batch on its nodes. Those slices' windows and bounds are what they were, so a run reads
    only the windows from the slice holding from_at on (a running attempt: the current hour),
    however long the attempt has run, and gives the rows a full recompute gives: that goes
    through the same slices, and the day sums add the slices in hour order. When the slices
    holding from_at end their windows by from_at (windows_end_at: a running attempt whose new
    windows start where the last run stopped), they are kept too and only the windows from
    from_at on are read and added to their sums, in start order (append_from). Any other
    attempt (and every attempt with FULL) is recomputed whole. Day rows from from_at's day on
    are rebuilt; a row is rewritten only if its values changed."""
    # JIT would compile these queries for a second or more on every run (whatever the engine says)
    conn.execute(text("SET LOCAL jit = off"))
    # the GPUs each dirty attempt is mapped to, as of this run
    conn.execute(
        text(
            """
            CREATE TEMP TABLE IF NOT EXISTS dirty_mapping (
                cluster text, job_id_raw bigint, submit_at timestamptz, node text, gpu_uuid text,
                mapping text, gpu_fraction real
            ) ON COMMIT DELETE ROWS
            """
        )
    )
    # the mapping check below looks each attempt's GPUs up (a scan of the table per attempt
    # without it: 2 s a run at 10,000 GPUs)
    conn.execute(
        text(
            "CREATE INDEX IF NOT EXISTS dirty_mapping_attempt ON dirty_mapping (cluster, job_id_raw, submit_at)"
        )
    )
    conn.execute(text("TRUNCATE dirty_mapping"))
    conn.execute(
        text(
            """
            INSERT INTO dirty_mapping
            WITH node_share AS (
                SELECT d.cluster, d.job_id_raw, d.submit_at, n.node, d.start_at, d.end_eff,
                       CAST(d.alloc_gpus AS float8) / cardinality(d.nodes) AS gpus_on_node
                FROM dirty_attempt d CROSS JOIN LATERAL unnest(d.nodes) AS n(node)
            ),
            proc AS (
                SELECT DISTINCT ns.cluster, ns.job_id_raw, ns.submit_at, ns.node, sp.gpu_uuid
                FROM node_share ns
                JOIN gpu_job_span sp ON sp.job_id = CAST(ns.job_id_raw AS text) AND sp.node = ns.node
                 AND sp.first_at < ns.end_eff AND sp.last_at > ns.start_at
            ),
            evidence AS (
                SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, 'process' AS mapping FROM proc
                UNION ALL
                SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.gpu_uuid, 'slurmctld'
                FROM gpu_allocation g JOIN dirty_attempt d USING (cluster, job_id_raw, submit_at)
                WHERE g.gpu_uuid <> ''
                  AND NOT EXISTS (
                      SELECT 1 FROM proc p
                      WHERE p.cluster = g.cluster AND p.job_id_raw = g.job_id_raw
                        AND p.submit_at = g.submit_at AND p.gpu_uuid = g.gpu_uuid)
            ),
            whole AS (
                SELECT ns.cluster, ns.job_id_raw, ns.submit_at, ns.node, u.gpu_uuid, 'whole_node' AS mapping
                FROM node_share ns
                JOIN LATERAL (
                    SELECT array_agg(DISTINCT i.gpu_uuid) AS uuids
                    FROM gpu_inventory i
                    WHERE i.node = ns.node AND i.parent_gpu_uuid = ''
                      AND i.first_seen_at <= ns.end_eff AND i.last_seen_at >= ns.start_at - interval '1 day'
                ) inv ON cardinality(inv.uuids) > 0 AND ns.gpus_on_node >= cardinality(inv.uuids)
                CROSS JOIN LATERAL unnest(inv.uuids) AS u(gpu_uuid)
                WHERE NOT EXISTS (
                    SELECT 1 FROM evidence e
                    WHERE e.cluster = ns.cluster AND e.job_id_raw = ns.job_id_raw
                      AND e.submit_at = ns.submit_at AND e.node = ns.node)
            ),
            mapped AS (SELECT * FROM evidence UNION ALL SELECT * FROM whole)
            SELECT m.cluster, m.job_id_raw, m.submit_at, m.node, m.gpu_uuid, m.mapping,
                   CAST(coalesce((SELECT i.gpu_fraction FROM gpu_inventory i WHERE i.gpu_uuid = m.gpu_uuid
                                  ORDER BY i.last_seen_at DESC LIMIT 1), 1.0) AS real)
            FROM mapped m
            """
        )
    )
    # from when on each attempt is recomputed (NULL, as select_dirty_attempts leaves it: all of
    # it): only an attempt whose slices were computed for the same start, nodes, GPU count and
    # day boundaries keeps any
    if not full:
        conn.execute(
            text(
                """
                UPDATE dirty_attempt d
                SET from_at = least(
                    p.computed_to, d.end_eff,
                    (SELECT min(b.lo) FROM new_batch b
                     WHERE (b.node = '' OR b.node = ANY (d.nodes)) AND b.lo < d.end_eff AND b.hi > d.start_at),
                    (SELECT min(h.lo) FROM new_host_batch h
                     WHERE (h.node = '' OR h.node = ANY (d.nodes))
                       AND (h.job_id IS NULL OR h.job_id = CAST(d.job_id_raw AS text))
                       AND h.lo < d.end_eff AND h.hi > d.start_at))
                FROM attribution_progress p
                WHERE p.cluster = d.cluster AND p.job_id_raw = d.job_id_raw AND p.submit_at = d.submit_at
                  AND p.start_at = d.start_at AND p.nodes = d.nodes AND p.alloc_gpus = d.alloc_gpus
                  AND p.timezone = CAST(:tz AS text)
                """
            ),
            {"tz": timezone},
        )
        # an attempt whose stored rows were mapped otherwise (new process evidence, inventory)
        # is recomputed whole
        conn.execute(
            text(
                """
                UPDATE dirty_attempt d SET from_at = NULL
                WHERE d.from_at IS NOT NULL AND EXISTS (
                    (SELECT m.node, m.gpu_uuid, m.mapping, m.gpu_fraction FROM dirty_mapping m
                     WHERE m.cluster = d.cluster AND m.job_id_raw = d.job_id_raw AND m.submit_at = d.submit_at
                     EXCEPT
                     SELECT g.node, g.gpu_uuid, g.mapping, g.gpu_fraction FROM gpu_attribution g
                     WHERE g.cluster = d.cluster AND g.job_id_raw = d.job_id_raw AND g.submit_at = d.submit_at
                       AND g.mapping <> 'unmapped')
                    UNION ALL
                    (SELECT g.node, g.gpu_uuid, g.mapping, g.gpu_fraction FROM gpu_attribution g
                     WHERE g.cluster = d.cluster AND g.job_id_raw = d.job_id_raw AND g.submit_at = d.submit_at
                       AND g.mapping <> 'unmapped'
                     EXCEPT
                     SELECT m.node, m.gpu_uuid, m.mapping, m.gpu_fraction FROM dirty_mapping m
                     WHERE m.cluster = d.cluster AND m.job_id_raw = d.job_id_raw AND m.submit_at = d.submit_at)
                )
                """
            )
        )
        conn.execute(
            text(
                "UPDATE dirty_attempt SET from_day = CAST(from_at AT TIME ZONE CAST(:tz AS text) AS date) "
                "WHERE from_at IS NOT NULL"
            ),
            {"tz": timezone},
        )
        # the slice holding from_at (its site day, its UTC hour) is added to, not read again,
        # when every GPU's slice there ends its windows by from_at: then no window it holds is
        # cut by from_at or later, and every window not in it starts at from_at or later
        # (from_at is at most the first window of any new batch on the attempt's nodes), so
        # adding those in start order to its sums gives the floats a full recompute gives.
        # So is an attempt computed to its end with nothing new in it (an ended attempt the
        # overlap selects again): its slices are what a recompute gives, its last window cut
        # by the same end
        conn.execute(
            text(
                f"""
                UPDATE dirty_attempt d SET append_from = d.from_at
                WHERE d.from_at IS NOT NULL AND (
                    NOT EXISTS (
                        SELECT 1 FROM gpu_attribution_part p
                        WHERE p.cluster = d.cluster AND p.job_id_raw = d.job_id_raw AND p.submit_at = d.submit_at
                          AND p.day = d.from_day AND p.hour_at = {utc_hour("d.from_at")}
                          AND (p.windows_end_at IS NULL OR p.windows_end_at > d.from_at))
                    OR (d.from_at = d.end_eff AND EXISTS (
                        SELECT 1 FROM attribution_progress p
                        WHERE p.cluster = d.cluster AND p.job_id_raw = d.job_id_raw AND p.submit_at = d.submit_at
                          AND p.computed_to = d.end_eff)))
                """
            )
        )
    conn.execute(
        text("CREATE TEMP TABLE IF NOT EXISTS kept_part (LIKE gpu_attribution_part) ON COMMIT DELETE ROWS")
    )
    conn.execute(text("TRUNCATE kept_part"))
    if not full:
        conn.execute(
            text(
                f"""
                INSERT INTO kept_part
                SELECT p.* FROM dirty_attempt d
                JOIN gpu_attribution_part p
                  ON p.cluster = d.cluster AND p.job_id_raw = d.job_id_raw AND p.submit_at = d.submit_at
                 AND p.day = d.from_day AND p.hour_at = {utc_hour("d.from_at")}
                WHERE d.append_from IS NOT NULL
                """
            )
        )
    if before_read is not None:
        # the sample store fetches the windows about to be read (samples.py)
        before_read(conn)
    # the slices from from_at on: a slice ends at the end of its UTC hour or of its site day
    # through the index, attempt by attempt: a hash join would read every attempt's slices
    conn.execute(text("SET LOCAL enable_hashjoin = off"))
    conn.execute(text("SET LOCAL enable_mergejoin = off"))
    conn.execute(
        text(
            """
            DELETE FROM gpu_attribution_part g USING dirty_attempt d
            WHERE g.cluster = d.cluster AND g.job_id_raw = d.job_id_raw AND g.submit_at = d.submit_at
              AND (d.from_at IS NULL OR (
                  g.day >= d.from_day
                  AND least(g.hour_at + interval '1 hour', CAST(g.day + 1 AS timestamp) AT TIME ZONE CAST(:tz AS text))
                      > d.from_at))
            """
        ),
        {"tz": timezone},
    )
    conn.execute(text("RESET enable_hashjoin"))
    conn.execute(text("RESET enable_mergejoin"))
    # the planner cannot count the rows of the CTEs below and joined them in nested loops,
    # rows x rows (2.8 s of a 4.2 s run at 2,500 GPUs, growing with the square); the lateral
    # reads stay nested loops, the only plan they have
    cause_lookups = ""
    if causes is not None:
        has_lustre = lustre_rates(conn)
        has_nfs = conn.execute(text("SELECT EXISTS (SELECT 1 FROM node_fs_window)")).scalar_one()
        cause_lookups = (
            _CAUSE_LOOKUPS
            + (_LUSTRE_LOOKUP if has_lustre else _NO_LUSTRE)
            + (_NFS_LOOKUP if has_nfs else _NO_NFS)
        )
    conn.execute(text("SET LOCAL enable_nestloop = off"))
    thresholds = causes or CauseThresholds()
    # idle causes in the same pass as the slices' other sums (causes None: not computed, NULL)
    cause_of = _CAUSE_OF if causes is not None else "NULL::text AS cause"
    cause_parts = (
        _CAUSE_PARTS if causes is not None else ", ".join(f"NULL::float8 AS {c}" for c in _CAUSE_NAMES)
    )
    cause_sums = _CAUSE_SUMS if causes is not None else ", ".join(["NULL::float8"] * len(CAUSES))
    slices, windows = conn.execute(
        text(
            f"""
            WITH {_SEGMENTS},
            -- per GPU and day segment, one read: from append_from when the slice holding
            -- from_at is added to, else from the start of that slice (a subquery kept apart by
            -- OFFSET 0: its bounds are computed once per segment, not again for every window
            -- read; ordered, so that the sort below is one per segment)
            gpu_segments AS (
                SELECT s.cluster, s.job_id_raw, s.submit_at, s.node, s.day, s.day_hi, s.from_at,
                       s.seg_start, s.seg_end, m.gpu_uuid, s.node_count, s.append_from,
                       CASE WHEN s.from_at IS NULL THEN s.seg_start
                            WHEN s.append_from IS NOT NULL THEN greatest(s.seg_start, s.append_from)
                            ELSE greatest(s.seg_start,
                                          date_trunc('hour', s.from_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
                       END AS read_start
                FROM segments s
                JOIN dirty_mapping m USING (cluster, job_id_raw, submit_at, node)
                ORDER BY s.cluster, s.job_id_raw, s.submit_at, s.node, m.gpu_uuid, s.day
                OFFSET 0
            ),
            read AS (
                SELECT gs.cluster, gs.job_id_raw, gs.submit_at, gs.node, gs.gpu_uuid, gs.day, gs.day_hi,
                       gs.from_at, gs.seg_start, gs.seg_end, gs.read_start, gs.node_count, w.*, {cause_of}
                FROM gpu_segments gs
                JOIN LATERAL (
                    SELECT DISTINCT ON (s.window_start_at) s.window_start_at, s.window_seconds, s.util_metric,
                           s.covered_seconds, s.idle_seconds, s.no_process_seconds, s.util_mean_percent,
                           s.util_max_percent, s.memory_used_max_bytes, s.energy_joules
                    FROM slurmtel_gpu_windows(ARRAY[gs.gpu_uuid], gs.read_start, gs.seg_end) s
                    -- added to a kept slice: only the windows it does not hold
                    WHERE gs.append_from IS NULL OR s.window_start_at >= gs.append_from
                    ORDER BY s.window_start_at, (s.source = 'agent') DESC
                ) w ON gs.read_start < gs.seg_end{cause_lookups}
            ),
            -- each window in the UTC hours it overlaps inside the read (a window is at most an
            -- hour long: one or two), by the fraction of it in the slice
            clipped AS (
                SELECT r.*, greatest(r.window_start_at, r.read_start) AS clip_start,
                       least(r.window_start_at + make_interval(secs => r.window_seconds), r.seg_end) AS clip_end
                FROM read r
            ),
            windows AS (
                SELECT c.*, h.hour_at,
                       greatest(0, date_part('epoch', least(c.clip_end, h.hour_at + interval '1 hour')
                                                      - greatest(c.clip_start, h.hour_at))) / c.window_seconds AS f
                FROM clipped c
                CROSS JOIN LATERAL unnest(
                    CASE WHEN {utc_hour("c.clip_end - interval '1 microsecond'")} > {utc_hour("c.clip_start")}
                         THEN ARRAY[{utc_hour("c.clip_start")},
                                    {utc_hour("c.clip_end - interval '1 microsecond'")}]
                         ELSE ARRAY[{utc_hour("c.clip_start")}] END
                ) AS h(hour_at)
                WHERE c.from_at IS NULL OR least(h.hour_at + interval '1 hour', c.day_hi) > c.from_at
            ),
            -- what each window adds to its slice's sums; a kept slice (kept_part) adds its
            -- sums first, as one row
            parts AS (
                SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, day, hour_at,
                       window_start_at AS sort_at, 1 AS windows, util_metric,
                       f * covered_seconds AS covered_seconds,
                       f * least(idle_seconds, covered_seconds) AS idle_seconds,
                       f * least(coalesce(no_process_seconds, 0), covered_seconds) AS no_process_seconds,
                       f * covered_seconds * coalesce(util_mean_percent, 0) AS util_weighted_sum,
                       util_max_percent, memory_used_max_bytes,
                       f * energy_joules AS energy_joules,
                       window_start_at + make_interval(secs => window_seconds) AS windows_end_at,
                       {cause_parts}
                FROM windows WHERE f > 0
                UNION ALL
                SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, day, hour_at,
                       '-infinity', windows, util_metric, covered_seconds, idle_seconds, no_process_seconds,
                       util_weighted_sum, util_max_percent, memory_used_max_bytes, energy_joules,
                       windows_end_at, {_CAUSE_COLUMNS}
                FROM kept_part
            ),
            -- a slice's sums add its windows in start order, so that a run and a full recompute
            -- give the same floats (a kept slice's sums are those of its windows in that order,
            -- all of which start before the ones added): the aggregate reads the rows in this
            -- order (sorting once, where sum(... ORDER BY) sorted once per aggregate and slice),
            -- and a statement that writes in a WITH never runs in parallel
            ordered AS (
                SELECT * FROM parts
                ORDER BY cluster, job_id_raw, submit_at, node, gpu_uuid, day, hour_at, sort_at
            ),
            written AS (
                INSERT INTO gpu_attribution_part (cluster, job_id_raw, submit_at, node, gpu_uuid, day, hour_at,
                    windows, util_metric, covered_seconds, idle_seconds, no_process_seconds, util_weighted_sum,
                    util_max_percent, memory_used_max_bytes, energy_joules, windows_end_at, {_CAUSE_COLUMNS})
                SELECT o.cluster, o.job_id_raw, o.submit_at, o.node, o.gpu_uuid, o.day, o.hour_at,
                       sum(o.windows),
                       min(o.util_metric),
                       sum(o.covered_seconds),
                       sum(o.idle_seconds),
                       sum(o.no_process_seconds),
                       sum(o.util_weighted_sum),
                       max(o.util_max_percent),
                       max(o.memory_used_max_bytes),
                       sum(o.energy_joules),
                       max(o.windows_end_at),
                       {cause_sums}
                FROM ordered o
                GROUP BY o.cluster, o.job_id_raw, o.submit_at, o.node, o.gpu_uuid, o.day, o.hour_at
                RETURNING windows
            )
            SELECT count(*), coalesce(sum(windows), 0) - (SELECT coalesce(sum(windows), 0) FROM kept_part)
            FROM written
            """
        ),
        {"tz": timezone, **(thresholds.params() if causes is not None else {})},
    ).one()
    # the day rows from from_day on, built from the slices
    conn.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS new_attribution (LIKE gpu_attribution INCLUDING DEFAULTS) "
            "ON COMMIT DELETE ROWS"
        )
    )
    conn.execute(text("TRUNCATE new_attribution"))
    conn.execute(
        text(
            f"""
            INSERT INTO new_attribution (cluster, job_id_raw, submit_at, node, gpu_uuid, day, {_ROW_VALUES})
            WITH {_SEGMENTS},
            gpu_segments AS (
                SELECT s.cluster, s.job_id_raw, s.submit_at, s.node, s.day, s.seg_start, s.seg_end,
                       m.gpu_uuid, m.mapping, m.gpu_fraction
                FROM segments s
                JOIN dirty_mapping m USING (cluster, job_id_raw, submit_at, node)
            ),
            -- the slices' sums per day, added in hour order (so a run gives the floats a full
            -- recompute gives); read attempt by attempt (lateral) through the index
            per_gpu AS (
                SELECT d.cluster, d.job_id_raw, d.submit_at, p.*
                FROM dirty_attempt d
                CROSS JOIN LATERAL (
                    SELECT p.node, p.gpu_uuid, p.day,
                           sum(p.covered_seconds ORDER BY p.hour_at) AS covered,
                           sum(p.idle_seconds ORDER BY p.hour_at) AS idle,
                           sum(p.no_process_seconds ORDER BY p.hour_at) AS no_process,
                           sum(p.util_weighted_sum ORDER BY p.hour_at) AS util_weighted,
                           max(p.util_max_percent) AS util_max,
                           max(p.memory_used_max_bytes) AS memory_max,
                           sum(p.energy_joules ORDER BY p.hour_at) AS energy,
                           min(p.util_metric) AS util_metric
                    FROM gpu_attribution_part p
                    WHERE p.cluster = d.cluster AND p.job_id_raw = d.job_id_raw AND p.submit_at = d.submit_at
                      AND (d.from_day IS NULL OR p.day >= d.from_day)
                    GROUP BY p.node, p.gpu_uuid, p.day
                ) p
            ),
            mapped_rows AS (
                SELECT gs.cluster, gs.job_id_raw, gs.submit_at, gs.node, gs.gpu_uuid, gs.day, gs.mapping,
                       gs.gpu_fraction, coalesce(p.util_metric, '') AS util_metric,
                       extract(epoch FROM gs.seg_end - gs.seg_start) AS allocated,
                       least(coalesce(p.covered, 0), extract(epoch FROM gs.seg_end - gs.seg_start)) AS covered,
                       coalesce(p.idle, 0) AS idle, coalesce(p.no_process, 0) AS no_process,
                       coalesce(p.util_weighted, 0) AS util_weighted, p.util_max, p.memory_max, p.energy
                FROM gpu_segments gs
                LEFT JOIN per_gpu p USING (cluster, job_id_raw, submit_at, node, gpu_uuid, day)
            ),
            unmapped_rows AS (
                SELECT s.cluster, s.job_id_raw, s.submit_at, s.node, '' AS gpu_uuid, s.day,
                       'unmapped' AS mapping, 1.0 AS gpu_fraction, '' AS util_metric,
                       s.gpus_on_node * extract(epoch FROM s.seg_end - s.seg_start)
                           - coalesce(sum(m.allocated), 0) AS allocated
                FROM segments s
                LEFT JOIN mapped_rows m USING (cluster, job_id_raw, submit_at, node, day)
                GROUP BY s.cluster, s.job_id_raw, s.submit_at, s.node, s.day, s.gpus_on_node, s.seg_start, s.seg_end
            )
            SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, day, mapping, gpu_fraction, util_metric,
                   allocated, covered,
                   greatest(0, covered - least(idle, covered)),
                   least(idle, covered),
                   least(no_process, covered),
                   greatest(0, allocated - covered),
                   util_weighted, util_max, memory_max, energy
            FROM mapped_rows
            UNION ALL
            SELECT cluster, job_id_raw, submit_at, node, gpu_uuid, day, mapping, gpu_fraction, util_metric,
                   allocated, 0, 0, 0, 0, allocated, 0, NULL, NULL, NULL
            FROM unmapped_rows WHERE allocated > 0.001
            """
        ),
        {"tz": timezone},
    )
    conn.execute(text("RESET enable_nestloop"))
    conn.execute(text("ANALYZE new_attribution"))
    # rewrite only the rows whose values changed: the report rollups' triggers recompute what
    # a statement touched
    same_key = " AND ".join(f"n.{c} = g.{c}" for c in _ROW_KEY)
    values = ", ".join(f"{{t}}.{c.strip()}" for c in _ROW_VALUES.split(","))
    conn.execute(
        text(
            f"""
            DELETE FROM gpu_attribution g USING dirty_attempt d
            WHERE g.cluster = d.cluster AND g.job_id_raw = d.job_id_raw AND g.submit_at = d.submit_at
              AND (d.from_day IS NULL OR g.day >= d.from_day)
              AND NOT EXISTS (
                  SELECT 1 FROM new_attribution n
                  WHERE {same_key}
                    AND ({values.format(t="n")}) IS NOT DISTINCT FROM ({values.format(t="g")}))
            """
        )
    )
    rows = conn.execute(
        text(
            f"""
            INSERT INTO gpu_attribution (cluster, job_id_raw, submit_at, node, gpu_uuid, day, {_ROW_VALUES})
            SELECT n.cluster, n.job_id_raw, n.submit_at, n.node, n.gpu_uuid, n.day, {values.format(t="n")}
            FROM new_attribution n
            WHERE NOT EXISTS (SELECT 1 FROM gpu_attribution g WHERE {same_key})
            """
        )
    ).rowcount
    conn.execute(
        text(
            """
            INSERT INTO attribution_progress AS p
                (cluster, job_id_raw, submit_at, computed_to, start_at, nodes, alloc_gpus, timezone)
            SELECT cluster, job_id_raw, submit_at, end_eff, start_at, nodes, alloc_gpus, CAST(:tz AS text)
            FROM dirty_attempt
            ON CONFLICT (cluster, job_id_raw, submit_at) DO UPDATE
            SET computed_to = EXCLUDED.computed_to, start_at = EXCLUDED.start_at, nodes = EXCLUDED.nodes,
                alloc_gpus = EXCLUDED.alloc_gpus, timezone = EXCLUDED.timezone
            WHERE (p.computed_to, p.start_at, p.nodes, p.alloc_gpus, p.timezone)
                  IS DISTINCT FROM (EXCLUDED.computed_to, EXCLUDED.start_at, EXCLUDED.nodes,
                                    EXCLUDED.alloc_gpus, EXCLUDED.timezone)
            """
        ),
        {"tz": timezone},
    )
    return Recomputed(int(rows or 0), int(slices), int(windows))


# each dirty attempt's node segments per site day, from from_day on (all days when NULL)
_SEGMENTS = """
            node_share AS (
                SELECT d.cluster, d.job_id_raw, d.submit_at, n.node, d.start_at, d.end_eff, d.from_at,
                       d.from_day, d.append_from, CAST(d.alloc_gpus AS float8) / cardinality(d.nodes) AS gpus_on_node,
                       cardinality(d.nodes) AS node_count
                FROM dirty_attempt d CROSS JOIN LATERAL unnest(d.nodes) AS n(node)
            ),
            segments AS (
                SELECT ns.cluster, ns.job_id_raw, ns.submit_at, ns.node, ns.gpus_on_node, ns.node_count,
                       ns.from_at, ns.append_from, dd.day,
                       dd.hi AS day_hi,
                       greatest(ns.start_at, dd.lo) AS seg_start, least(ns.end_eff, dd.hi) AS seg_end
                FROM node_share ns
                CROSS JOIN LATERAL (
                    SELECT CAST(g AS date) AS day,
                           g AT TIME ZONE CAST(:tz AS text) AS lo,
                           (g + interval '1 day') AT TIME ZONE CAST(:tz AS text) AS hi
                    FROM generate_series(
                        date_trunc('day', ns.start_at AT TIME ZONE CAST(:tz AS text)),
                        date_trunc('day', (ns.end_eff - interval '1 microsecond') AT TIME ZONE CAST(:tz AS text)),
                        interval '1 day') AS g
                ) dd
                WHERE ns.from_day IS NULL OR dd.day >= ns.from_day
            )"""


def dirty_attempt_spans(conn: Connection) -> list[tuple[str, datetime, datetime]]:
    """(node, lo, hi) per attempt in dirty_attempt and node it has a mapped GPU on: the time
    recompute_dirty reads windows of, from append_from, else the hour of from_at (or the start),
    to its end."""
    return [
        (r.node, r.lo, r.hi)
        for r in conn.execute(
            text(
                """
                SELECT DISTINCT m.node,
                       CASE WHEN d.from_at IS NULL THEN d.start_at
                            WHEN d.append_from IS NOT NULL THEN greatest(d.start_at, d.append_from)
                            ELSE greatest(d.start_at,
                                          date_trunc('hour', d.from_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
                       END AS lo,
                       d.end_eff AS hi
                FROM dirty_attempt d
                JOIN dirty_mapping m USING (cluster, job_id_raw, submit_at)
                WHERE m.gpu_uuid <> ''
                """
            )
        )
    ]


def refresh_job_spans(conn: Connection, selection: DirtySelection, *, everything: bool = False) -> int:
    """Fold the job ids of the SELECTION's new telemetry batches (every stored window with
    EVERYTHING) into gpu_job_span: per GPU, job and hour, the first and last window in which the
    job's processes were on the GPU. Idempotent: spans only grow."""
    if everything:
        bind: dict[str, object] = {"ids": None, "lo": "-infinity", "hi": "infinity"}
    elif selection.batch_window is None:
        return 0
    else:
        # the batches' ids and their windows' time range as values: the planner then reads only
        # the day partitions they fall in, through the batch index (a join with new_batch
        # would scan every partition of the retention period)
        lo, hi = selection.batch_window
        bind = {"ids": selection.batches, "lo": lo, "hi": hi}
    result = conn.execute(
        text(
            """
            INSERT INTO gpu_job_span AS sp (node, gpu_uuid, job_id, hour, first_at, last_at)
            SELECT s.node, s.gpu_uuid, j.job_id, date_trunc('hour', s.window_start_at),
                   min(s.window_start_at), max(s.window_start_at + make_interval(secs => s.window_seconds))
            FROM slurmtel_batch_windows(CAST(:ids AS bigint[]), CAST(:lo AS timestamptz), CAST(:hi AS timestamptz)) s
            CROSS JOIN LATERAL unnest(s.job_ids) AS j(job_id)
            WHERE cardinality(s.job_ids) > 0
            GROUP BY s.node, s.gpu_uuid, j.job_id, date_trunc('hour', s.window_start_at)
            ON CONFLICT (gpu_uuid, job_id, hour) DO UPDATE
            SET first_at = least(sp.first_at, EXCLUDED.first_at), last_at = greatest(sp.last_at, EXCLUDED.last_at),
                node = EXCLUDED.node
            """
        ),
        bind,
    )
    return int(result.rowcount or 0)


def delete_parts_before(conn: Connection, cutoff_at: datetime) -> int:
    """Forget the hour slices that end by CUTOFF_AT (retention: they live as long as the windows
    they sum; the day rows built from them stay). A run only ever rebuilds days from the first
    new window on, and no window before the retention is taken, so no run needs them again."""
    result = conn.execute(
        text("DELETE FROM gpu_attribution_part WHERE hour_at < :cutoff"), {"cutoff": cutoff_at}
    )
    return int(result.rowcount or 0)


def forget_host_batches(conn: Connection, batch_ids: Sequence[int]) -> None:
    """Delete the host batches a run folded in (those committed meanwhile stay for the next)."""
    if batch_ids:
        conn.execute(
            text("DELETE FROM host_batch WHERE id = ANY (CAST(:ids AS bigint[]))"), {"ids": list(batch_ids)}
        )


def mark_batches(conn: Connection, batch_ids: list[int]) -> None:
    if batch_ids:
        conn.execute(
            text(
                "INSERT INTO attribution_batch (batch_id) SELECT unnest(CAST(:ids AS bigint[])) "
                "ON CONFLICT DO NOTHING"
            ),
            {"ids": batch_ids},
        )


# ---------------------------------------------------------------- idle GPU-seconds by cause

CAUSES = IDLE_CAUSES
_CAUSE_NAMES = tuple(f"cause_{c}_seconds" for c in CAUSES)
_CAUSE_COLUMNS = ", ".join(_CAUSE_NAMES)
# per slice: no_process is the idle time without a process; the rest of a window's idle time
# goes to its window's one cause (windows without idle time have none: NULL, which sum skips)
_IDLE_W = "least(idle_seconds, covered_seconds)"
_NP_W = "least(coalesce(no_process_seconds, 0), idle_seconds, covered_seconds)"
_CAUSE_PARTS = ",\n".join(
    [f"CASE WHEN cause IS NOT NULL THEN f * {_NP_W} END AS {_CAUSE_NAMES[0]}"]
    + [
        f"CASE WHEN cause = '{c}' THEN f * ({_IDLE_W} - {_NP_W}) END AS {name}"
        for c, name in zip(CAUSES[1:], _CAUSE_NAMES[1:], strict=True)
    ]
)
_CAUSE_SUMS = ",\n".join(f"coalesce(sum(o.{name}), 0)" for name in _CAUSE_NAMES)


@dataclass(frozen=True)
class CauseThresholds:
    """config.idle_causes as the attribution SQL reads it."""

    io_pressure_share: float = 0.10
    io_bytes_per_second: float = 500e6
    network_bytes_per_second: float = 1e9
    cpu_saturated_share: float = 0.90
    cpu_pressure_share: float = 0.50

    def params(self) -> dict[str, float]:
        return {f"c_{k}": float(v) for k, v in self.__dict__.items()}


def lustre_rates(conn: Connection) -> bool:
    """The temporary table lustre_rate of the run's attempts' job ids: per Lustre entry (target,
    job name) and snapshot, the interval since the entry's previous snapshot (lo, hi] and the
    bytes read and written in it per second, spread evenly over it. An entry recreated (its
    counters went backwards or its start_time changed: job_cleanup_interval, a reused job id)
    or seen first counts from its start_time (Lustre 2.15+); without one, when those bytes
    moved is not known and they are left out. MDT entries move no bytes. Whether it has rows."""
    conn.execute(text("DROP TABLE IF EXISTS lustre_rate"))
    conn.execute(
        text(
            """
            CREATE TEMP TABLE lustre_rate ON COMMIT DROP AS
            WITH s AS (
                SELECT l.job_id, l.snapshot_at, l.start_at, l.read_bytes, l.write_bytes,
                       lag(l.snapshot_at) OVER w AS prev_at, lag(l.start_at) OVER w AS prev_start,
                       lag(l.read_bytes) OVER w AS prev_read, lag(l.write_bytes) OVER w AS prev_write
                FROM lustre_job_stat l
                WHERE l.job_id IN (SELECT DISTINCT CAST(job_id_raw AS text) FROM dirty_attempt)
                  AND (l.read_bytes IS NOT NULL OR l.write_bytes IS NOT NULL)
                WINDOW w AS (PARTITION BY l.target, l.job_name ORDER BY l.snapshot_at)
            ),
            inc AS (
                SELECT job_id, snapshot_at,
                       prev_at IS NULL OR coalesce(read_bytes < prev_read, false)
                           OR coalesce(write_bytes < prev_write, false)
                           OR start_at IS DISTINCT FROM prev_start AS anew,
                       start_at, prev_at, read_bytes, write_bytes, prev_read, prev_write
                FROM s
            ),
            spans AS (
                SELECT job_id, snapshot_at AS hi,
                       CASE WHEN anew THEN start_at ELSE prev_at END AS lo,
                       CASE WHEN anew THEN coalesce(read_bytes, 0) + coalesce(write_bytes, 0)
                            ELSE coalesce(read_bytes - prev_read, 0) + coalesce(write_bytes - prev_write, 0)
                       END AS moved
                FROM inc
            )
            SELECT job_id, lo, hi, moved / date_part('epoch', hi - lo) AS bytes_per_second
            FROM spans WHERE lo IS NOT NULL AND lo < hi AND moved > 0
            """
        )
    )
    if not conn.execute(text("SELECT EXISTS (SELECT 1 FROM lustre_rate)")).scalar_one():
        return False
    conn.execute(text("CREATE INDEX ON lustre_rate (job_id, hi)"))
    conn.execute(text("ANALYZE lustre_rate"))
    return True


# Each window read into a slice, with the one cause of its idle time beyond no-process, by
# precedence (docs/idle-causes.md): hardware (an XID or double-bit ECC event on the GPU, or
# NVML's HW-slowdown throttle, in the window) > unmeasured (no cgroup window of the job on the
# node, and no Lustre traffic over the threshold: the host side is not known) > storage_wait
# (the job's IO pressure, or its block IO, Lustre traffic and, when it holds the node alone, the
# node's NFS traffic together, over the thresholds) > network_wait (a multi-node job whose node's fabric ports were busy) >
# cpu_bound (the job's CPUs saturated, or CPU pressure) > idle_unexplained. Windows without
# idle time are not looked up (the laterals' filter is false before any index is read).
_CAUSE_OF = """
                       CASE
                           WHEN w.idle_seconds <= 0 THEN NULL
                           WHEN coalesce(gh.throttle_hw_slowdown_seconds, 0) > 0 OR ev.hit
                               THEN 'hardware'
                           WHEN jh.window_seconds IS NULL
                                AND coalesce(lu.bytes, 0) < :c_io_bytes_per_second * w.window_seconds
                               THEN 'unmeasured'
                           WHEN coalesce(jh.io_some_stall_seconds, 0) >= :c_io_pressure_share * jh.window_seconds
                             OR coalesce(jh.read_bytes, 0) + coalesce(jh.write_bytes, 0) + coalesce(lu.bytes, 0)
                                + coalesce(nf.bytes, 0)
                                >= :c_io_bytes_per_second * coalesce(jh.window_seconds, w.window_seconds)
                               THEN 'storage_wait'
                           WHEN coalesce(fb.bytes, 0) >= :c_network_bytes_per_second * w.window_seconds
                               THEN 'network_wait'
                           WHEN (jh.cpus > 0 AND coalesce(jh.cpu_usage_seconds, 0)
                                    >= :c_cpu_saturated_share * jh.cpus * jh.window_seconds)
                             OR coalesce(jh.cpu_some_stall_seconds, 0) >= :c_cpu_pressure_share * jh.window_seconds
                               THEN 'cpu_bound'
                           ELSE 'idle_unexplained'
                       END AS cause"""
# one index probe per idle window (the statement runs without nested loop joins, and a hash
# join would read the whole table every run)
_CAUSE_LOOKUPS = """
                LEFT JOIN LATERAL (
                    SELECT j.window_seconds, j.read_bytes, j.write_bytes, j.cpus, j.cpu_usage_seconds,
                           j.io_some_stall_seconds, j.cpu_some_stall_seconds
                    FROM job_host_window j
                    WHERE w.idle_seconds > 0 AND j.node = gs.node AND j.job_id = CAST(gs.job_id_raw AS text)
                      AND j.window_start_at = w.window_start_at
                    LIMIT 1  -- kept a lateral subquery: never pulled up into a (hash) join
                ) jh ON true
                LEFT JOIN LATERAL (
                    SELECT g.throttle_hw_slowdown_seconds FROM gpu_host_window g
                    WHERE w.idle_seconds > 0 AND g.gpu_uuid = gs.gpu_uuid AND g.window_start_at = w.window_start_at
                    LIMIT 1
                ) gh ON true
                LEFT JOIN LATERAL (
                    SELECT true AS hit FROM gpu_event e
                    WHERE w.idle_seconds > 0 AND e.gpu_uuid = gs.gpu_uuid AND e.kind IN ('xid', 'ecc_double_bit')
                      AND e.at >= w.window_start_at AND e.at < w.window_start_at + make_interval(secs => w.window_seconds)
                    LIMIT 1
                ) ev ON true
                LEFT JOIN LATERAL (
                    -- port_*_data count 4-byte words
                    SELECT sum(coalesce((p.deltas ->> 'port_xmit_data')::float8, 0)
                               + coalesce((p.deltas ->> 'port_rcv_data')::float8, 0)) * 4 AS bytes
                    FROM fabric_port_window p
                    WHERE w.idle_seconds > 0 AND gs.node_count > 1 AND p.node = gs.node
                      AND p.window_start_at = w.window_start_at
                ) fb ON true"""
# the job's Lustre and (alone on its node) NFS and GPFS bytes in the window; a run with no Lustre rates
# or no NFS windows at all reads a constant instead (a probe per idle window costs ~25 %)
_LUSTRE_LOOKUP = """
                LEFT JOIN LATERAL (
                    -- the job's Lustre bytes in the window: each snapshot interval's rate times
                    -- its overlap with the window (lustre_rates)
                    SELECT sum(l.bytes_per_second * greatest(0, date_part('epoch',
                               least(l.hi, w.window_start_at + make_interval(secs => w.window_seconds))
                               - greatest(l.lo, w.window_start_at)))) AS bytes
                    FROM lustre_rate l
                    WHERE w.idle_seconds > 0 AND l.job_id = CAST(gs.job_id_raw AS text)
                      AND l.hi > w.window_start_at
                      AND l.lo < w.window_start_at + make_interval(secs => w.window_seconds)
                ) lu ON true"""
_NFS_LOOKUP = """
                LEFT JOIN LATERAL (
                    -- the node's NFS and GPFS traffic, the job's only when no other job had a cgroup
                    -- window on the node in the window (it held the node alone)
                    SELECT sum(coalesce(n.read_bytes, 0) + coalesce(n.write_bytes, 0)) AS bytes
                    FROM node_fs_window n
                    WHERE w.idle_seconds > 0 AND jh.window_seconds IS NOT NULL AND n.node = gs.node
                      AND n.window_start_at = w.window_start_at
                      AND coalesce(n.read_bytes, 0) + coalesce(n.write_bytes, 0) > 0
                      AND NOT EXISTS (
                          SELECT 1 FROM job_host_window o
                          WHERE o.node = gs.node AND o.window_start_at = w.window_start_at
                            AND o.job_id <> CAST(gs.job_id_raw AS text)
                      )
                ) nf ON true"""
_NO_LUSTRE = "\n                CROSS JOIN (SELECT NULL::float8 AS bytes) lu"
_NO_NFS = "\n                CROSS JOIN (SELECT NULL::float8 AS bytes) nf"
