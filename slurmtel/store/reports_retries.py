"""Retries (DESIGN §4): requeues, resubmission chains and the GPU-hours they cost.

- A *job* is (cluster, job_id_raw, job_submit_at): its attempts are `sacct -D`'s rows.
  requeues = attempts − 1; the attempts before a job's last one were requeued.
- A *resubmission* is a job that follows a failed job (its last attempt user_failure or
  system_failure) of the same cluster, user, account, partition and job name, submitted within
  `attribution.resubmission_window_seconds` after that failed job ended. Each job follows at
  most one failed job (the latest to end before its submission) and each failed job is
  followed by at most one resubmission (the first submitted), so resubmissions form chains.
- *retry GPU-hours* = allocated GPU-hours of retry attempts: every failed attempt of a job in a
  chain (two or more jobs), and every requeued attempt whatever its state (the job ran again,
  so that allocation was spent once more). An attempt that is both counts once.

The links are kept in retry_link by the attribution run (slurmtel.store.attribution), so
reports read them as of the last run. While retry_link was computed with another window or
other outcome classes than the report's (or never), the report computes the links at query
time instead, from the jobs within reach of the window (slower, same figures).

Chains are built from the jobs within reach of the window: submitted from one resubmission
window before the earliest submission of a job active in the window to one after the latest
end of such a job.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from operator import itemgetter
from typing import Any

from slurmtel.access import Scope
from slurmtel.filters import JobFilter
from slurmtel.store.reports_admin import as_seconds, no_jit, params
from slurmtel.store.retry_links import (
    RESUBMISSION_WINDOW,
    bucket_sql,
    link_ctes,
    requeued_sql,
    retry_links_current,
)
from slurmtel.store.sql import Connection, text
from slurmtel.vocabulary import REQUEUE_STATES

DEFAULT_RESUBMISSION_WINDOW_SECONDS = 21600

_W = RESUBMISSION_WINDOW
# as the partial index job_attempt_requeue_or_later spells them (migration 0013)
_REQUEUE_STATES_SQL = "(" + ", ".join(f"'{s}'" for s in REQUEUE_STATES) + ")"
_NEAR_COLUMNS = (
    "cluster, job_id_raw, submit_at, job_submit_at, attempt_number, name, user_name, account, "
    "partition, state, outcome, alloc_gpus, start_at, end_at"
)
# what the failures report needs of every attempt besides (it splits GPU-seconds over nodes);
# the job id, exit code and node list of its top attempts it looks up for those alone
_DETAIL_COLUMNS = "nodes"


def _columns(detail: bool) -> str:
    return f"{_NEAR_COLUMNS}, {_DETAIL_COLUMNS}" if detail else _NEAR_COLUMNS


def windowed_ctes(*, detail: bool = False) -> str:
    """The CTEs `near` (the attempts within reach of the window: every windowed attempt, every
    job submitted between :retry_lo and :retry_hi and every attempt that ended then; one scan of
    job_attempt, narrow columns, DETAIL adds the nodes) and `windowed` (the
    windowed attempts of `report usage`, read from near, GPU-seconds as float8: it sums far
    faster than numeric and reports round to 1e-4 GPU-hours)."""
    columns = _columns(detail)
    return f"""
    near AS MATERIALIZED (
        SELECT {columns} FROM job_attempt_outcome a
        WHERE a.submit_at <= CAST(:retry_hi AS timestamptz)
          AND coalesce(a.end_at, CAST(:now AS timestamptz)) >= CAST(:retry_lo AS timestamptz)
          AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
          AND slurmtel_job_filter(cluster, account, user_name, partition, :f_accounts, :f_users, :f_partitions, :f_clusters)
    ),
    windowed AS (
        SELECT {columns},
               CAST(slurmtel_window_gpu_seconds(alloc_gpus, start_at, end_at, :start, :end, :now) AS float8)
                   AS gpu_seconds
        FROM near
        WHERE slurmtel_attempt_in_window(start_at, end_at, submit_at, :start, :end, :now)
    )
"""


# CTEs after windowed_ctes(), computing the links at query time. They define chain_link (a
# resubmission -> the failed job it follows), chain_member (jobs in a chain), retry_attempt
# (keys of the windowed attempts that are retry attempts) and w (the windowed attempts with
# is_retry). :retry_lo and :retry_hi come from
# prepare_retries() (literal bounds let the planner hash-join the jobs; bounds computed in the
# same statement leave it guessing, and it guessed a nested loop over 200,000 x 40,000 rows).
RETRY_CTES = f"""
    retry_job_start AS (
        SELECT a.cluster, a.job_id_raw, a.submit_at AS job_submit_at, a.user_name, a.account,
               a.partition, a.name, {bucket_sql("a.submit_at")} AS bucket
        FROM near a
        WHERE a.attempt_number = 1 AND a.submit_at >= CAST(:retry_lo AS timestamptz)
    ),
    retry_failed_job AS MATERIALIZED (
        -- materialised, so that the planner keeps the bucket equi-join
        SELECT a.cluster, a.job_id_raw, coalesce(a.job_submit_at, a.submit_at) AS job_submit_at,
               a.user_name, a.account, a.partition, a.name, a.end_at,
               unnest(ARRAY[{bucket_sql("a.end_at")}, {bucket_sql("a.end_at")} + 1]) AS bucket
        FROM near a
        WHERE slurmtel_failed(a.outcome) AND a.end_at <= CAST(:retry_hi AS timestamptz)
          AND NOT {requeued_sql("a")}
    ),
    {link_ctes(starts="retry_job_start", failed="retry_failed_job", prefix="chain")},
    chain_member AS (
        SELECT cluster, job_id_raw, job_submit_at FROM chain_link
        UNION
        SELECT cluster, prev_job_id_raw, prev_job_submit_at FROM chain_link
    ),
    retry_attempt AS (
        SELECT w.cluster, w.job_id_raw, w.submit_at FROM windowed w WHERE {requeued_sql("w")}
        UNION
        SELECT w.cluster, w.job_id_raw, w.submit_at
        FROM windowed w JOIN chain_member k
          ON k.cluster = w.cluster AND k.job_id_raw = w.job_id_raw
         AND k.job_submit_at = coalesce(w.job_submit_at, w.submit_at)
        WHERE slurmtel_failed(w.outcome)
    ),
    w AS (
        SELECT windowed.*, {requeued_sql("windowed")} AS requeued, (r.job_id_raw IS NOT NULL) AS is_retry
        FROM windowed LEFT JOIN retry_attempt r USING (cluster, job_id_raw, submit_at)
    )
"""


# the jobs at either end of a stored link, in scope and filter (a link's jobs share its
# user, account, partition and cluster)
_LINKED_JOBS = """
    SELECT cluster, job_id_raw, job_submit_at FROM retry_link WHERE slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts) AND slurmtel_job_filter(cluster, account, user_name, partition, :f_accounts, :f_users, :f_partitions, :f_clusters)
    UNION ALL
    SELECT cluster, prev_job_id_raw, prev_job_submit_at FROM retry_link WHERE slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts) AND slurmtel_job_filter(cluster, account, user_name, partition, :f_accounts, :f_users, :f_partitions, :f_clusters)
"""


def stored_retry_ctes(*, detail: bool = False, name: str = "w") -> str:
    """The CTE NAME: the windowed attempts of `report usage` (GPU-seconds as float8; DETAIL
    adds the nodes) with requeued and is_retry (a retry attempt), reading
    retry_link."""
    # is_retry in the same scan: the linked jobs are one hash table, looked up by the failed
    # attempts only (a join back to the windowed attempts sorted 170,000 wide rows on disk)
    return f"""
    {name} AS (
        SELECT r.*,
               (r.requeued
                OR (slurmtel_failed(r.outcome)
                    AND (r.cluster, r.job_id_raw, coalesce(r.job_submit_at, r.submit_at)) IN ({_LINKED_JOBS})))
                   AS is_retry
        FROM (
            SELECT {_columns(detail)}, CAST(gpu_seconds AS float8) AS gpu_seconds,
                   {requeued_sql("a")} AS requeued
            FROM (SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)) a
        ) r
    )"""


# CTEs after a CTE job_window (cluster, job_id_raw, job_submit_at, last_end_at: the windowed
# jobs): chain_link, the stored links within reach of the window as RETRY_CTES computes them
# (a link's jobs share its key, so scope and filter apply to either), and chain_member
STORED_CHAIN_CTES = f"""
    chain_reach AS (
        SELECT least(CAST(:start AS timestamptz), min(job_submit_at)) - {_W} AS lo,
               greatest(CAST(:end AS timestamptz), max(last_end_at)) + {_W} AS hi
        FROM job_window
    ),
    chain_link AS (
        SELECT l.cluster, l.job_id_raw, l.job_submit_at, l.prev_job_id_raw, l.prev_job_submit_at
        FROM retry_link l CROSS JOIN chain_reach r
        WHERE l.job_submit_at >= r.lo AND l.job_submit_at <= r.hi AND l.prev_end_at >= r.lo
          AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts) AND slurmtel_job_filter(cluster, account, user_name, partition, :f_accounts, :f_users, :f_partitions, :f_clusters)
    ),
    chain_member AS (
        SELECT cluster, job_id_raw, job_submit_at FROM chain_link
        UNION
        SELECT cluster, prev_job_id_raw, prev_job_submit_at FROM chain_link
    )"""


def use_stored_links(conn: Connection, bind: dict[str, Any]) -> bool:
    """Whether a report whose bind parameters are BIND (window, now, scope, filter,
    resubmission_seconds) reads retry_link (it holds the links for that window); if not, it
    computes them at query time and BIND gets :retry_lo and :retry_hi. Sets the planner up for
    either, for the rest of the transaction. Call after no_jit()."""
    if retry_links_current(conn, int(bind["resubmission_seconds"])):
        # the row estimates of w are far too low (tens of thousands for 200,000), and with them
        # the planner sorts every job for a merge join where one hash table costs a tenth
        conn.execute(text("SET LOCAL enable_mergejoin = off"))
        return True
    bind.update(prepare_retries(conn, bind))
    return False


def retry_ctes(conn: Connection, bind: dict[str, Any], *, detail: bool = False) -> str:
    """The CTE w (see stored_retry_ctes) and those it needs, for a report whose bind parameters
    are BIND (see use_stored_links)."""
    if use_stored_links(conn, bind):
        return stored_retry_ctes(detail=detail)
    return f"{windowed_ctes(detail=detail)}, {RETRY_CTES}"


def prepare_retries(conn: Connection, bind: dict[str, Any]) -> dict[str, Any]:
    """:retry_lo and :retry_hi for windowed_ctes() and RETRY_CTES: from one resubmission window
    before the earliest submission of a job active in the window to one after the latest end of
    such a job. BIND holds the windowed attempts' parameters (window, now, scope, filter,
    resubmission_seconds). Also turns merge and nested-loop joins off for the rest of the
    transaction: the CTEs' row estimates are far too low (a few rows for tens of thousands), and
    with them the planner sorts 200,000 jobs for a merge join where hashing costs a third, or
    loops over 40,000 x 17,000 rows where one hash table does."""
    lo, hi = conn.execute(
        text(
            f"""
            SELECT least(CAST(:start AS timestamptz), min(coalesce(job_submit_at, submit_at))) - {_W},
                   greatest(CAST(:end AS timestamptz), max(coalesce(end_at, CAST(:now AS timestamptz)))) + {_W}
            FROM (SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)) w
            """
        ),
        bind,
    ).one()
    conn.execute(text("SET LOCAL enable_mergejoin = off"))
    conn.execute(text("SET LOCAL enable_nestloop = off"))
    return {"retry_lo": lo, "retry_hi": hi}


def job_scope_params(scope: Scope) -> dict[str, Any]:
    """Bind parameters of the scope clause for single-job detail (`:job_scope_*`)."""
    return {f"job_{k}": v for k, v in scope.sql_params().items()}


def retries_report(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    scope: Scope,
    job_scope: Scope | None = None,
    job_filter: JobFilter | None = None,
    resubmission_window_seconds: int = DEFAULT_RESUBMISSION_WINDOW_SECONDS,
) -> dict[str, list[dict[str, Any]]]:
    """Sections `chains` (chains with a job active in the window, with their jobs; JOB_SCOPE,
    default SCOPE), `by_account` and `by_user` (jobs, requeues, resubmissions, chains, retry
    and failed GPU-hours in the window; SCOPE)."""
    if end <= start:
        raise ValueError("the window is empty: -E must be after -S")
    bind = params(
        scope,
        job_filter,
        start=start,
        end=end,
        now=now,
        resubmission_seconds=resubmission_window_seconds,
    )
    bind.update(job_scope_params(job_scope or scope))
    no_jit(conn)
    if use_stored_links(conn, bind):
        # w twice: each is read once, so neither is materialised (see job_window)
        ctes = f"{stored_retry_ctes()}, {stored_retry_ctes(name='w_again')}"
        chain_ctes = f", {STORED_CHAIN_CTES}"
        # the chains' estimates are a row or two for thousands: no loops over them
        conn.execute(text("SET LOCAL enable_nestloop = off"))
    else:
        ctes, chain_ctes = f"{windowed_ctes()}, {RETRY_CTES}, w_again AS (SELECT * FROM w)", ""
    sql = f"""
        WITH RECURSIVE {ctes},
        job_window AS (
            -- a job with one attempt is that attempt: only the others are grouped (hashing
            -- 200,000 jobs of one attempt each costs more than reading the attempts twice)
            SELECT cluster, job_id_raw, coalesce(job_submit_at, submit_at) AS job_submit_at, user_name,
                   account, CAST(0 AS bigint) AS requeues,
                   CASE WHEN is_retry THEN gpu_seconds ELSE 0 END AS retry_gpu_seconds,
                   CASE WHEN slurmtel_failed(outcome) THEN gpu_seconds ELSE 0 END AS failed_gpu_seconds,
                   coalesce(end_at, CAST(:now AS timestamptz)) AS last_end_at
            FROM w WHERE attempt_number = 1 AND NOT requeued
            UNION ALL
            SELECT cluster, job_id_raw, coalesce(job_submit_at, submit_at), min(user_name), min(account),
                   count(*) FILTER (WHERE coalesce(attempt_number, 1) > 1),
                   coalesce(sum(gpu_seconds) FILTER (WHERE is_retry), 0),
                   coalesce(sum(gpu_seconds) FILTER (WHERE slurmtel_failed(outcome)), 0),
                   max(coalesce(end_at, CAST(:now AS timestamptz)))
            FROM w_again
            -- the first condition is what requeued implies, spelled as the partial index
            -- job_attempt_requeue_or_later (migration 0013) is: that index finds these few
            WHERE (attempt_number IS DISTINCT FROM 1 OR state IN {_REQUEUE_STATES_SQL})
              AND (attempt_number IS DISTINCT FROM 1 OR requeued)
            GROUP BY cluster, job_id_raw, coalesce(job_submit_at, submit_at)
        ){chain_ctes},
        chain_job AS (
            SELECT DISTINCT ON (k.cluster, k.job_id_raw, k.job_submit_at)
                   k.cluster, k.job_id_raw, k.job_submit_at, a.job_id, a.user_name, a.account,
                   a.partition, a.name, a.outcome, a.end_at, coalesce(a.attempt_number, 1) AS attempts,
                   slurmtel_in_scope(user_name, account, :job_scope_all, :job_scope_users, :job_scope_accounts) AS visible
            FROM chain_member k
            JOIN job_attempt_outcome a
              ON a.cluster = k.cluster AND a.job_id_raw = k.job_id_raw
             AND coalesce(a.job_submit_at, a.submit_at) = k.job_submit_at
            ORDER BY k.cluster, k.job_id_raw, k.job_submit_at, a.attempt_number DESC
        ),
        -- links between jobs that exist (a stored link whose job changed since the last
        -- attribution run links nothing)
        chain_step AS (
            SELECT l.* FROM chain_link l
            WHERE EXISTS (SELECT 1 FROM chain_job c WHERE c.cluster = l.cluster
                            AND c.job_id_raw = l.job_id_raw AND c.job_submit_at = l.job_submit_at)
              AND EXISTS (SELECT 1 FROM chain_job c WHERE c.cluster = l.cluster
                            AND c.job_id_raw = l.prev_job_id_raw AND c.job_submit_at = l.prev_job_submit_at)
        ),
        -- each chain from its first job (one that follows none), in order
        chain_walk AS (
            SELECT s.cluster, s.prev_job_id_raw AS root_id_raw, s.prev_job_submit_at AS root_submit_at,
                   s.prev_job_id_raw AS job_id_raw, s.prev_job_submit_at AS job_submit_at, 1 AS position
            FROM (SELECT DISTINCT cluster, prev_job_id_raw, prev_job_submit_at FROM chain_step) s
            WHERE NOT EXISTS (SELECT 1 FROM chain_step f WHERE f.cluster = s.cluster
                                AND f.job_id_raw = s.prev_job_id_raw AND f.job_submit_at = s.prev_job_submit_at)
            UNION ALL
            SELECT k.cluster, k.root_id_raw, k.root_submit_at, l.job_id_raw, l.job_submit_at, k.position + 1
            FROM chain_walk k JOIN chain_step l
              ON l.cluster = k.cluster AND l.prev_job_id_raw = k.job_id_raw AND l.prev_job_submit_at = k.job_submit_at
        ),
        -- as few ordered aggregates as the chain's order needs (PostgreSQL 15 sorts each group
        -- once for every one): its first job's user, account, partition, name and visibility
        -- are its root's, and it has no last end while its last job (the one that no job
        -- follows) has not ended
        chain AS (
            SELECT k.cluster, k.root_id_raw, k.root_submit_at,
                   min(r.user_name) AS user_name, min(r.account) AS account,
                   min(r.partition) AS partition, min(r.name) AS name, bool_and(r.visible) AS visible,
                   array_agg(c.job_id ORDER BY k.position) AS job_ids,
                   array_agg(c.outcome ORDER BY k.position) AS outcomes,
                   count(*) FILTER (WHERE slurmtel_failed(c.outcome)) AS failed_jobs,
                   sum(c.attempts - 1) AS requeues,
                   CASE WHEN bool_or(c.end_at IS NULL AND k.last) THEN NULL ELSE max(c.end_at) END
                       AS last_end_at,
                   -- float8 added in chain order, as the report always has
                   sum(coalesce(jw.retry_gpu_seconds, 0) ORDER BY k.position) AS retry_gpu_seconds,
                   sum(coalesce(jw.failed_gpu_seconds, 0) ORDER BY k.position) AS failed_gpu_seconds,
                   bool_or(jw.job_id_raw IS NOT NULL) AS in_window
            FROM (
                SELECT w.*, n.prev_job_id_raw IS NULL AS last
                FROM chain_walk w
                LEFT JOIN chain_step n
                  ON n.cluster = w.cluster AND n.prev_job_id_raw = w.job_id_raw
                 AND n.prev_job_submit_at = w.job_submit_at
            ) k
            JOIN chain_job c
              ON c.cluster = k.cluster AND c.job_id_raw = k.job_id_raw AND c.job_submit_at = k.job_submit_at
            JOIN chain_job r
              ON r.cluster = k.cluster AND r.job_id_raw = k.root_id_raw AND r.job_submit_at = k.root_submit_at
            LEFT JOIN job_window jw
              ON jw.cluster = k.cluster AND jw.job_id_raw = k.job_id_raw AND jw.job_submit_at = k.job_submit_at
            GROUP BY k.cluster, k.root_id_raw, k.root_submit_at
        )
        SELECT CASE WHEN grouping(j.user_name) = 1 THEN 'by_account' ELSE 'by_user' END AS kind,
               j.cluster, coalesce(j.user_name, j.account) AS grp,
               count(*) AS jobs, sum(j.requeues) AS requeues, count(l.job_id_raw) AS resubmissions,
               sum(j.retry_gpu_seconds) AS retry_gpu_seconds, sum(j.failed_gpu_seconds) AS failed_gpu_seconds,
               NULL::bigint AS root_id_raw, NULL::timestamptz AS first_submit_at,
               NULL AS user_name, NULL AS account, NULL AS partition, NULL AS name, NULL::boolean AS visible,
               NULL::text[] AS job_ids, NULL::text[] AS outcomes, NULL::bigint AS failed_jobs,
               NULL::timestamptz AS last_end_at
        FROM job_window j LEFT JOIN chain_link l USING (cluster, job_id_raw, job_submit_at)
        GROUP BY GROUPING SETS ((j.cluster, j.account), (j.cluster, j.user_name))
        UNION ALL
        SELECT 'chain', cluster, NULL, NULL, requeues, NULL, retry_gpu_seconds,
               failed_gpu_seconds, root_id_raw, root_submit_at, user_name, account, partition, name,
               visible, job_ids, outcomes, failed_jobs, last_end_at
        FROM chain WHERE in_window
    """
    groups: dict[str, list[dict[str, Any]]] = {"by_account": [], "by_user": []}
    # rows read by position: looking 8,600 chains' columns up by name cost hundredths of a second
    chains: list[Any] = []
    for r in conn.execute(text(sql), bind):
        if r[_KIND] == "chain":
            chains.append(r)
            continue
        group = "account" if r[_KIND] == "by_account" else "user"
        groups[r[_KIND]].append(
            {
                "cluster": r[_CLUSTER],
                group: r[_GROUP],
                "jobs": int(r[_JOBS]),
                "requeues": int(r[_REQUEUES] or 0),
                "resubmissions": int(r[_RESUBMISSIONS]),
                "chains": 0,
                "retry_gpu_seconds": as_seconds(r[_RETRY]),
                "failed_gpu_seconds": as_seconds(r[_FAILED]),
            }
        )
    # every chain counts for the account and user of its first job
    chains.sort(key=itemgetter(_CLUSTER, _ROOT, _FIRST_SUBMIT))
    for group, field in (("by_account", _ACCOUNT), ("by_user", _USER)):
        counts = Counter((c[_CLUSTER], c[field]) for c in chains)
        for row in groups[group]:
            row["chains"] = counts[(row["cluster"], row[group.removeprefix("by_")])]
    sections: dict[str, list[dict[str, Any]]] = {
        "chains": [_chain_row(c) for c in chains if c[_VISIBLE]],
        **groups,
    }
    sections["chains"].sort(key=lambda c: (-c["retry_gpu_seconds"], c["cluster"], c["job_ids"]))
    for name in ("by_account", "by_user"):
        group = name.removeprefix("by_")
        sections[name].sort(key=lambda g: (g["cluster"], -g["retry_gpu_seconds"], g[group]))
    return sections


# the positions of the columns of GROUPS_SELECT and CHAINS_SELECT
(_KIND, _CLUSTER, _GROUP, _JOBS, _REQUEUES, _RESUBMISSIONS, _RETRY, _FAILED, _ROOT, _FIRST_SUBMIT,
 _USER, _ACCOUNT, _PARTITION, _NAME, _VISIBLE, _JOB_IDS, _OUTCOMES, _FAILED_JOBS, _LAST_END) = range(19)  # fmt: skip


def _chain_row(chain: Any) -> dict[str, Any]:
    job_ids = chain[_JOB_IDS]
    return {
        "cluster": chain[_CLUSTER],
        "user": chain[_USER],
        "account": chain[_ACCOUNT],
        "partition": chain[_PARTITION],
        "name": chain[_NAME],
        "jobs": len(job_ids),
        "job_ids": list(job_ids),
        "outcomes": list(chain[_OUTCOMES]),
        "failed_jobs": int(chain[_FAILED_JOBS]),
        "requeues": int(chain[_REQUEUES]),
        "resubmissions": len(job_ids) - 1,
        "first_submit_at": chain[_FIRST_SUBMIT],
        "last_end_at": chain[_LAST_END],
        "retry_gpu_seconds": as_seconds(chain[_RETRY]),
        "failed_gpu_seconds": as_seconds(chain[_FAILED]),
    }
