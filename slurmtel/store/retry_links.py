"""Retry links (DESIGN §4): which job is a resubmission of which failed job.

The attribution run keeps retry_link up to date (refresh_retry_links); `report retries`,
`failures` and `capacity` read it, or compute the same links at query time with the CTEs built
here (link_ctes, requeued_sql, bucket_sql) when retry_link was made with another window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slurmtel.store.sql import Connection, text
from slurmtel.vocabulary import REQUEUE_STATES

# A resubmission is a job that follows a failed job (its last attempt user_failure or
# system_failure, and not requeued) of the same cluster, user, account, partition and job
# name, submitted within the resubmission window W after that failed job ended. Each job
# follows at most one failed job (the latest to end before its submission) and each failed
# job is followed by at most one resubmission (the first submitted), so resubmissions form
# chains. retry_link holds every such link; `report retries`, `failures` and `capacity` read
# it (slurmtel.store.reports_retries).
#
# Incremental upkeep rests on locality: whom a job follows depends only on the failed jobs of
# its key that ended in the W before its submission, and a failed job's resubmission only on
# the jobs of its key submitted in the W after it ended. So when a job changes, only links with
# a resubmission submitted, or a failed job ended, within W of where the job was or is can
# change: every link in that "region" (key, [lo, hi]) is recomputed from the jobs of the key
# within W of it, the rest stay as they are. (A link within a region depends on no job further
# out: its resubmission, and every other job that could be the failed job's first, was
# submitted within W after the failed job ended, and whether such a job follows that failed
# job is decided by the failed jobs that ended between the two.)

# W as an interval, and W-sized time buckets (at least a second wide) for an equi-join
RESUBMISSION_WINDOW = "make_interval(secs => CAST(:resubmission_seconds AS float8))"
_BUCKET = "floor(date_part('epoch', {at}) / greatest(CAST(:resubmission_seconds AS float8), 1))"
_REQUEUE_SQL = "(" + ", ".join(f"'{s}'" for s in REQUEUE_STATES) + ")"
_KEY = ("cluster", "user_name", "account", "partition", "name")
_LINK_COLUMNS = (
    "cluster, job_id_raw, job_submit_at, prev_job_id_raw, prev_job_submit_at, prev_end_at, "
    "user_name, account, partition, name"
)


def bucket_sql(at: str) -> str:
    """The W-sized time bucket of the timestamp expression AT."""
    return _BUCKET.format(at=at)


def requeued_sql(alias: str) -> str:
    """Whether the attempt ALIAS (a job_attempt row) was requeued: it ended in a requeue state
    and its job has a later attempt (link_jobs only continues a job after a requeue state)."""
    return f"""(CASE WHEN {alias}.state IN {_REQUEUE_SQL} THEN EXISTS (
        SELECT 1 FROM job_attempt n
        WHERE n.cluster = {alias}.cluster AND n.job_id_raw = {alias}.job_id_raw
          AND n.job_submit_at = {alias}.job_submit_at AND n.attempt_number > {alias}.attempt_number)
        ELSE false END)"""


def link_ctes(*, starts: str, failed: str, prefix: str) -> str:
    """CTEs PREFIX_pair, PREFIX_follows and PREFIX_link: the resubmission links between the
    jobs of the CTE STARTS (cluster, job_id_raw, job_submit_at, the key, bucket: each job's
    first attempt) and the failed jobs of the CTE FAILED (cluster, job_id_raw, job_submit_at,
    the key, end_at, bucket: each failed job twice, in its end's bucket and the next, so that a
    resubmission meets it in its own bucket: an equi-join on the key and the bucket instead of
    pairing every job with every failed job of its name). PREFIX_link has _LINK_COLUMNS."""
    return f"""
    {prefix}_pair AS (
        SELECT s.cluster, s.job_id_raw, s.job_submit_at, p.job_id_raw AS prev_job_id_raw,
               p.job_submit_at AS prev_job_submit_at, p.end_at AS prev_end_at,
               s.user_name, s.account, s.partition, s.name
        FROM {failed} p
        JOIN {starts} s
          ON s.name = p.name AND s.user_name = p.user_name AND s.bucket = p.bucket
         AND s.cluster = p.cluster AND s.account = p.account AND s.partition = p.partition
        WHERE s.job_submit_at >= p.end_at AND s.job_submit_at <= p.end_at + {RESUBMISSION_WINDOW}
          AND (p.job_id_raw, p.job_submit_at) <> (s.job_id_raw, s.job_submit_at)
    ),
    {prefix}_follows AS (
        SELECT DISTINCT ON (cluster, job_id_raw, job_submit_at) *
        FROM {prefix}_pair
        ORDER BY cluster, job_id_raw, job_submit_at, prev_end_at DESC, prev_job_id_raw DESC,
                 prev_job_submit_at DESC
    ),
    {prefix}_link AS (
        SELECT DISTINCT ON (cluster, prev_job_id_raw, prev_job_submit_at) {_LINK_COLUMNS}
        FROM {prefix}_follows
        ORDER BY cluster, prev_job_id_raw, prev_job_submit_at, job_submit_at, job_id_raw
    )"""


def _in_region(alias: str, condition: str) -> str:
    """EXISTS a retry_region row r of ALIAS's key that meets CONDITION."""
    key = " AND ".join(f"r.{c} = {alias}.{c}" for c in _KEY)
    return f"EXISTS (SELECT 1 FROM retry_region r WHERE {key} AND {condition})"


def _links_sql(*, regional: bool) -> str:
    """SELECT of every link; REGIONAL: of the links computed from the jobs of a retry_region
    row's key submitted, and the failed jobs that ended, within W of the region: all that a
    link with a resubmission submitted or a failed job ended within the region depends on (see
    the locality note above). Links further out may be wrong (a failed job that ended between
    two regions is missing): the caller keeps only those within a region."""
    w = RESUBMISSION_WINDOW
    starts_in = failed_in = ""
    if regional:
        starts_in = "AND " + _in_region("a", f"a.submit_at BETWEEN r.lo - {w} AND r.hi + {w}")
        failed_in = "AND " + _in_region("a", f"a.end_at BETWEEN r.lo - {w} AND r.hi + {w}")
    return f"""
        WITH link_start AS (
            SELECT a.cluster, a.job_id_raw, a.submit_at AS job_submit_at, a.user_name, a.account,
                   a.partition, a.name, {bucket_sql("a.submit_at")} AS bucket
            FROM job_attempt a
            WHERE a.attempt_number = 1 {starts_in}
        ),
        link_failed AS MATERIALIZED (
            SELECT a.cluster, a.job_id_raw, coalesce(a.job_submit_at, a.submit_at) AS job_submit_at,
                   a.user_name, a.account, a.partition, a.name, a.end_at,
                   unnest(ARRAY[{bucket_sql("a.end_at")}, {bucket_sql("a.end_at")} + 1]) AS bucket
            FROM job_attempt_outcome a
            WHERE slurmtel_failed(a.outcome) AND a.end_at IS NOT NULL AND NOT {requeued_sql("a")}
              {failed_in}
        ),
        {link_ctes(starts="link_start", failed="link_failed", prefix="computed")}
        SELECT {_LINK_COLUMNS} FROM computed_link
    """


# a link within a region of retry_region r: its resubmission submitted or its failed job ended there
_LINK_IN_REGION = "(l.job_submit_at BETWEEN r.lo AND r.hi OR l.prev_end_at BETWEEN r.lo AND r.hi)"


@dataclass(frozen=True)
class RetryLinkRefresh:
    full: bool
    regions: int
    links: int


# an incremental run with more regions than this share of the attempts (and at least the
# minimum) recomputes every link instead (200,000 attempts: 10,000 regions take about as long)
FULL_LINKS_SHARE = 0.05
FULL_LINKS_MIN_REGIONS = 1000

FAILED_STATES_SQL = (
    "SELECT coalesce(array_agg(state ORDER BY state COLLATE \"C\"), '{}') FROM outcome_class "
    "WHERE slurmtel_failed(outcome)"
)


def retry_links_current(conn: Connection, window_seconds: int) -> bool:
    """Whether retry_link holds the links for WINDOW_SECONDS and today's outcome classes
    (as of the last attribution run)."""
    current = conn.execute(
        text(
            f"SELECT s.window_seconds = :window AND s.failed_states = ({FAILED_STATES_SQL}) "
            "FROM retry_link_state s"
        ),
        {"window": int(window_seconds)},
    ).scalar_one_or_none()
    return bool(current)


def refresh_retry_links(
    conn: Connection,
    *,
    window_seconds: int,
    job_mark: datetime | None,
    overlap_seconds: int,
    full: bool = False,
) -> RetryLinkRefresh:
    """Bring retry_link up to date with job_attempt, in the caller's transaction.

    Recomputes every link with FULL, without a JOB_MARK (first run), or when the resubmission
    window or the states classed as failed differ from those of the last run; otherwise only
    the regions of the jobs with an attempt written since JOB_MARK - OVERLAP_SECONDS (their
    key and times now, and those of the links they had). Idempotent: a run with nothing new
    changes no link."""
    bind = {"resubmission_seconds": float(window_seconds)}
    # JIT would compile these queries for a second or more on every run; sorts of a month of
    # jobs fit in 32 MB
    conn.execute(text("SET LOCAL jit = off"))
    conn.execute(text("SET LOCAL work_mem = '32MB'"))
    if full or job_mark is None or not retry_links_current(conn, window_seconds):
        return _recompute_all_links(conn, window_seconds, bind)
    regions = _fill_regions(conn, job_mark=job_mark, overlap_seconds=overlap_seconds, bind=bind)
    if not regions:
        return RetryLinkRefresh(False, 0, 0)
    attempts = conn.execute(
        text("SELECT reltuples FROM pg_class WHERE oid = 'job_attempt'::regclass")
    ).scalar()
    if regions > max(FULL_LINKS_MIN_REGIONS, FULL_LINKS_SHARE * float(attempts or 0)):
        # a backfill: recomputing every link costs less than a region per changed job
        return _recompute_all_links(conn, window_seconds, bind)
    conn.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS retry_link_new ON COMMIT DELETE ROWS "
            f"AS SELECT {_LINK_COLUMNS} FROM retry_link WITH NO DATA"
        )
    )
    conn.execute(text("TRUNCATE retry_link_new"))
    conn.execute(text(f"INSERT INTO retry_link_new ({_LINK_COLUMNS}) {_links_sql(regional=True)}"), bind)
    # (a statement of its own: within the INSERT the planner guessed one link, and looped)
    conn.execute(text(f"DELETE FROM retry_link_new l WHERE NOT {_in_region('l', _LINK_IN_REGION)}"))
    key = " AND ".join(f"r.{c} = l.{c}" for c in _KEY)
    conn.execute(text(f"DELETE FROM retry_link l USING retry_region r WHERE {key} AND {_LINK_IN_REGION}"))
    # a job or failed job linked elsewhere before (only after a missed write): its new link wins
    for end in ("job", "prev_job"):
        conn.execute(
            text(
                f"""
                DELETE FROM retry_link l USING retry_link_new n
                WHERE l.cluster = n.cluster AND l.{end}_id_raw = n.{end}_id_raw
                  AND l.{end}_submit_at = n.{end}_submit_at
                """
            )
        )
    written = conn.execute(
        text(f"INSERT INTO retry_link ({_LINK_COLUMNS}) SELECT {_LINK_COLUMNS} FROM retry_link_new")
    ).rowcount
    conn.execute(text("UPDATE retry_link_state SET computed_at = now()"))
    return RetryLinkRefresh(False, regions, int(written or 0))


def _recompute_all_links(conn: Connection, window_seconds: int, bind: dict[str, Any]) -> RetryLinkRefresh:
    conn.execute(text("DELETE FROM retry_link"))
    written = conn.execute(
        text(f"INSERT INTO retry_link ({_LINK_COLUMNS}) {_links_sql(regional=False)}"), bind
    ).rowcount
    _save_link_state(conn, window_seconds)
    return RetryLinkRefresh(True, 0, int(written or 0))


def _fill_regions(conn: Connection, *, job_mark: datetime, overlap_seconds: int, bind: dict[str, Any]) -> int:
    """Fill the temp table retry_region (key, lo, hi; overlapping spans merged) with where the
    jobs of the job ids written since JOB_MARK - OVERLAP_SECONDS are and were linked:
    within W of each job's submission (as a resubmission), of each attempt's end (as a failed
    job) and of the links either end of which has such a job id (their key before any
    change; a job id rather than a job, as relinking attempts changes a job's submit time)."""
    w = RESUBMISSION_WINDOW
    key = ", ".join(_KEY)

    def keyed(alias: str) -> str:
        return ", ".join(f"{alias}.{c}" for c in _KEY)

    conn.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS retry_region (cluster text, user_name text, account text, "
            "partition text, name text, lo timestamptz, hi timestamptz) ON COMMIT DELETE ROWS"
        )
    )
    conn.execute(text("TRUNCATE retry_region"))
    count = conn.execute(
        text(
            f"""
            INSERT INTO retry_region ({key}, lo, hi)
            WITH dirty AS MATERIALIZED (
                SELECT DISTINCT cluster, job_id_raw FROM job_attempt
                WHERE updated_at > CAST(:mark AS timestamptz) - make_interval(secs => CAST(:overlap AS float8))
            ),
            span AS (
                SELECT {keyed("a")}, a.submit_at - {w} AS lo, a.submit_at + {w} AS hi
                FROM job_attempt a JOIN dirty d USING (cluster, job_id_raw)
                WHERE a.attempt_number = 1
                UNION ALL
                SELECT {keyed("a")}, a.end_at - {w}, a.end_at + {w}
                FROM job_attempt a JOIN dirty d USING (cluster, job_id_raw)
                WHERE a.end_at IS NOT NULL
                UNION ALL
                SELECT {keyed("l")}, l.prev_end_at - {w}, l.job_submit_at + {w}
                FROM retry_link l JOIN dirty d USING (cluster, job_id_raw)
                UNION ALL
                SELECT {keyed("l")}, l.prev_end_at - {w}, l.job_submit_at + {w}
                FROM retry_link l JOIN dirty d ON d.cluster = l.cluster AND d.job_id_raw = l.prev_job_id_raw
            ),
            ordered AS (
                SELECT *, max(hi) OVER (PARTITION BY {key} ORDER BY lo, hi
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
                FROM span
            ),
            island AS (
                SELECT *, count(*) FILTER (WHERE reach IS NULL OR lo > reach)
                              OVER (PARTITION BY {key} ORDER BY lo, hi) AS island
                FROM ordered
            )
            SELECT {key}, min(lo), max(hi) FROM island GROUP BY {key}, island
            """
        ),
        {**bind, "mark": job_mark, "overlap": float(overlap_seconds)},
    ).rowcount
    if count:
        conn.execute(text("ANALYZE retry_region"))
    return int(count or 0)


def _save_link_state(conn: Connection, window_seconds: int) -> None:
    conn.execute(
        text(
            f"""
            INSERT INTO retry_link_state (singleton, window_seconds, failed_states, computed_at)
            VALUES (true, :window, ({FAILED_STATES_SQL}), now())
            ON CONFLICT (singleton) DO UPDATE
            SET window_seconds = EXCLUDED.window_seconds, failed_states = EXCLUDED.failed_states,
                computed_at = EXCLUDED.computed_at
            """
        ),
        {"window": int(window_seconds)},
    )
