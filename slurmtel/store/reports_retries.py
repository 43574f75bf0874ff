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

Chains are built from the jobs within reach of the window: submitted from one resubmission
window before the earliest submission of a job active in the window to one after the latest
end of such a job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.access import SCOPE_SQL, Scope
from slurmtel.store.jobs import REQUEUE_STATES
from slurmtel.store.reports_admin import FAILED_SQL, hours, no_jit, params
from slurmtel.store.usage import FILTER_SQL, WINDOWED_ATTEMPTS_SQL, JobFilter

DEFAULT_RESUBMISSION_WINDOW_SECONDS = 21600

_W = "make_interval(secs => CAST(:resubmission_seconds AS float8))"
# resubmission-window-sized time buckets (at least a second wide)
_BUCKET = "floor(date_part('epoch', {at}) / greatest(CAST(:resubmission_seconds AS float8), 1))"
_REQUEUE_SQL = "(" + ", ".join(f"'{s}'" for s in REQUEUE_STATES) + ")"
_NEAR_COLUMNS = (
    "cluster, job_id_raw, submit_at, job_submit_at, attempt_number, name, user_name, account, "
    "partition, state, outcome, alloc_gpus, start_at, end_at"
)
# what the failures report shows of single attempts besides
_DETAIL_COLUMNS = "job_id, exit_code, nodelist, nodes"
_FROM_ATTEMPTS = "FROM job_attempt_outcome a"
assert _FROM_ATTEMPTS in WINDOWED_ATTEMPTS_SQL


def windowed_ctes(*, detail: bool = False) -> str:
    """The CTEs `near` (the attempts within reach of the window: every windowed attempt, every
    job submitted between :retry_lo and :retry_hi and every attempt that ended then; one scan of
    job_attempt, narrow columns, DETAIL adds job id, exit code and nodes) and `w` (the windowed
    attempts of `report usage`, read from near, GPU-seconds as float8: it sums far faster than
    numeric and reports round to 1e-4 GPU-hours)."""
    columns = f"{_NEAR_COLUMNS}, {_DETAIL_COLUMNS}" if detail else _NEAR_COLUMNS
    return f"""
    near AS MATERIALIZED (
        SELECT {columns} FROM job_attempt_outcome a
        WHERE a.submit_at <= CAST(:retry_hi AS timestamptz)
          AND coalesce(a.end_at, CAST(:now AS timestamptz)) >= CAST(:retry_lo AS timestamptz)
          AND {SCOPE_SQL}
          AND {FILTER_SQL}
    ),
    w AS (
        SELECT {columns}, CAST(gpu_seconds AS float8) AS gpu_seconds
        FROM ({WINDOWED_ATTEMPTS_SQL.replace(_FROM_ATTEMPTS, "FROM near a")}) windowed
    )
"""


# An attempt of the same job after this one (link_jobs only continues a job after a requeue state).
_LATER_ATTEMPT = """EXISTS (
    SELECT 1 FROM job_attempt n
    WHERE n.cluster = {a}.cluster AND n.job_id_raw = {a}.job_id_raw
      AND n.job_submit_at = {a}.job_submit_at AND n.attempt_number > {a}.attempt_number)"""


def _requeued(alias: str) -> str:
    later = _LATER_ATTEMPT.format(a=alias)
    return f"(CASE WHEN {alias}.state IN {_REQUEUE_SQL} THEN {later} ELSE false END)"


# CTEs after windowed_ctes(). They define retry_link (a resubmission -> the failed job it
# follows), retry_chain_job (jobs in a chain) and retry_attempt (keys of the windowed attempts
# that are retry attempts). :retry_lo and :retry_hi come from prepare_retries() (literal bounds
# let the planner hash-join the jobs; bounds computed in the same statement leave it guessing,
# and it guessed a nested loop over 200,000 x 40,000 rows).
RETRY_CTES = f"""
    retry_job_start AS (
        SELECT a.cluster, a.job_id_raw, a.submit_at AS job_submit_at, a.user_name, a.account,
               a.partition, a.name, {_BUCKET.format(at="a.submit_at")} AS bucket
        FROM near a
        WHERE a.attempt_number = 1 AND a.submit_at >= CAST(:retry_lo AS timestamptz)
    ),
    retry_failed_job AS MATERIALIZED (
        -- a resubmission is submitted in its failed job's end bucket or the next one: each
        -- failed job twice, once per bucket, for an equi-join on the chain's key and the
        -- bucket instead of pairing every job with every failed job of its name
        -- (materialised, so that the planner keeps it that way)
        SELECT a.cluster, a.job_id_raw, coalesce(a.job_submit_at, a.submit_at) AS job_submit_at,
               a.user_name, a.account, a.partition, a.name, a.end_at,
               unnest(ARRAY[{_BUCKET.format(at="a.end_at")}, {_BUCKET.format(at="a.end_at")} + 1]) AS bucket
        FROM near a
        WHERE a.outcome IN {FAILED_SQL} AND a.end_at <= CAST(:retry_hi AS timestamptz)
          AND NOT {_requeued("a")}
    ),
    retry_pair AS (
        SELECT s.cluster, s.job_id_raw, s.job_submit_at, p.job_id_raw AS prev_job_id_raw,
               p.job_submit_at AS prev_job_submit_at, p.end_at AS prev_end_at
        FROM retry_failed_job p
        JOIN retry_job_start s
          ON s.name = p.name AND s.user_name = p.user_name AND s.bucket = p.bucket
         AND s.cluster = p.cluster AND s.account = p.account AND s.partition = p.partition
        WHERE s.job_submit_at >= p.end_at AND s.job_submit_at <= p.end_at + {_W}
    ),
    retry_follows AS (
        SELECT DISTINCT ON (cluster, job_id_raw, job_submit_at)
               cluster, job_id_raw, job_submit_at, prev_job_id_raw, prev_job_submit_at
        FROM retry_pair
        WHERE (prev_job_id_raw, prev_job_submit_at) <> (job_id_raw, job_submit_at)
        ORDER BY cluster, job_id_raw, job_submit_at, prev_end_at DESC, prev_job_id_raw DESC
    ),
    retry_link AS (
        SELECT DISTINCT ON (cluster, prev_job_id_raw, prev_job_submit_at) *
        FROM retry_follows
        ORDER BY cluster, prev_job_id_raw, prev_job_submit_at, job_submit_at, job_id_raw
    ),
    retry_chain_job AS (
        SELECT cluster, job_id_raw, job_submit_at FROM retry_link
        UNION
        SELECT cluster, prev_job_id_raw, prev_job_submit_at FROM retry_link
    ),
    retry_attempt AS (
        SELECT w.cluster, w.job_id_raw, w.submit_at FROM w WHERE {_requeued("w")}
        UNION
        SELECT w.cluster, w.job_id_raw, w.submit_at
        FROM w JOIN retry_chain_job k
          ON k.cluster = w.cluster AND k.job_id_raw = w.job_id_raw
         AND k.job_submit_at = coalesce(w.job_submit_at, w.submit_at)
        WHERE w.outcome IN {FAILED_SQL}
    )
"""

_JOB_SCOPE_SQL = SCOPE_SQL.replace(":scope_", ":job_scope_")


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
            FROM ({WINDOWED_ATTEMPTS_SQL}) w
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
    sql = f"""
        WITH {windowed_ctes()},
        {RETRY_CTES},
        fw AS (
            SELECT w.cluster, w.job_id_raw, coalesce(w.job_submit_at, w.submit_at) AS job_submit_at,
                   w.user_name, w.account, w.attempt_number, w.outcome, w.gpu_seconds,
                   (r.job_id_raw IS NOT NULL) AS is_retry
            FROM w LEFT JOIN retry_attempt r USING (cluster, job_id_raw, submit_at)
        ),
        job_window AS (
            SELECT cluster, job_id_raw, job_submit_at, min(user_name) AS user_name,
                   min(account) AS account,
                   count(*) FILTER (WHERE coalesce(attempt_number, 1) > 1) AS requeues,
                   coalesce(sum(gpu_seconds) FILTER (WHERE is_retry), 0) AS retry_gpu_seconds,
                   coalesce(sum(gpu_seconds) FILTER (WHERE outcome IN {FAILED_SQL}), 0) AS failed_gpu_seconds
            FROM fw GROUP BY cluster, job_id_raw, job_submit_at
        ),
        chain_job AS (
            SELECT DISTINCT ON (k.cluster, k.job_id_raw, k.job_submit_at)
                   k.cluster, k.job_id_raw, k.job_submit_at, a.job_id, a.user_name, a.account,
                   a.partition, a.name, a.outcome, a.end_at, coalesce(a.attempt_number, 1) AS attempts,
                   {_JOB_SCOPE_SQL} AS visible
            FROM retry_chain_job k
            JOIN job_attempt_outcome a
              ON a.cluster = k.cluster AND a.job_id_raw = k.job_id_raw
             AND coalesce(a.job_submit_at, a.submit_at) = k.job_submit_at
            ORDER BY k.cluster, k.job_id_raw, k.job_submit_at, a.attempt_number DESC
        )
        SELECT CASE WHEN grouping(j.user_name) = 1 THEN 'by_account' ELSE 'by_user' END AS kind,
               j.cluster, coalesce(j.user_name, j.account) AS grp,
               count(*) AS jobs, sum(j.requeues) AS requeues, count(l.job_id_raw) AS resubmissions,
               sum(j.retry_gpu_seconds) AS retry_gpu_seconds, sum(j.failed_gpu_seconds) AS failed_gpu_seconds,
               NULL::bigint AS job_id_raw, NULL::timestamptz AS job_submit_at,
               NULL::bigint AS prev_job_id_raw, NULL::timestamptz AS prev_job_submit_at,
               NULL AS job_id, NULL AS user_name, NULL AS account, NULL AS partition, NULL AS name,
               NULL AS outcome, NULL::timestamptz AS end_at, NULL::integer AS attempts,
               NULL::boolean AS in_window, NULL::boolean AS visible
        FROM job_window j LEFT JOIN retry_link l USING (cluster, job_id_raw, job_submit_at)
        GROUP BY GROUPING SETS ((j.cluster, j.account), (j.cluster, j.user_name))
        UNION ALL
        SELECT 'link', cluster, NULL, NULL, NULL, NULL, NULL, NULL, job_id_raw, job_submit_at,
               prev_job_id_raw, prev_job_submit_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM retry_link
        UNION ALL
        SELECT 'job', c.cluster, NULL, NULL, NULL, NULL, jw.retry_gpu_seconds, jw.failed_gpu_seconds,
               c.job_id_raw, c.job_submit_at, NULL, NULL, c.job_id, c.user_name, c.account, c.partition,
               c.name, c.outcome, c.end_at, c.attempts, jw.job_id_raw IS NOT NULL, c.visible
        FROM chain_job c LEFT JOIN job_window jw USING (cluster, job_id_raw, job_submit_at)
    """
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
    bind.update(prepare_retries(conn, bind))
    groups: dict[str, list[dict[str, Any]]] = {"by_account": [], "by_user": []}
    following: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    jobs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in conn.execute(text(sql), bind).mappings():
        kind = r["kind"]
        if kind == "link":
            following[(r["cluster"], r["prev_job_id_raw"], r["prev_job_submit_at"])] = (
                r["cluster"],
                r["job_id_raw"],
                r["job_submit_at"],
            )
        elif kind == "job":
            jobs[(r["cluster"], r["job_id_raw"], r["job_submit_at"])] = {
                "cluster": r["cluster"],
                "job_submit_at": r["job_submit_at"],
                "job_id": r["job_id"],
                "user": r["user_name"],
                "account": r["account"],
                "partition": r["partition"],
                "name": r["name"],
                "outcome": r["outcome"],
                "end_at": r["end_at"],
                "requeues": int(r["attempts"]) - 1,
                "in_window": r["in_window"],
                "visible": r["visible"],
                "retry_gpu_seconds": r["retry_gpu_seconds"] or 0,
                "failed_gpu_seconds": r["failed_gpu_seconds"] or 0,
            }
        else:
            key = "account" if kind == "by_account" else "user"
            groups[kind].append(
                {
                    "cluster": r["cluster"],
                    key: r["grp"],
                    "jobs": int(r["jobs"]),
                    "requeues": int(r["requeues"] or 0),
                    "resubmissions": int(r["resubmissions"]),
                    "chains": 0,
                    "retry_gpu_hours": hours(r["retry_gpu_seconds"]),
                    "failed_gpu_hours": hours(r["failed_gpu_seconds"]),
                }
            )
    chains = _chains(following, jobs)
    _count_chains(groups, chains)
    sections: dict[str, list[dict[str, Any]]] = {
        "chains": [_chain_row(chain) for chain in chains if chain[0]["visible"]],
        **groups,
    }
    sections["chains"].sort(key=lambda c: (-c["retry_gpu_hours"], c["cluster"], c["job_ids"]))
    for name in ("by_account", "by_user"):
        group = name.removeprefix("by_")
        sections[name].sort(key=lambda g: (g["cluster"], -g["retry_gpu_hours"], g[group]))
    return sections


def _chains(
    following: dict[tuple[Any, ...], tuple[Any, ...]], jobs: dict[tuple[Any, ...], dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """Chains (lists of jobs in order) that have a job active in the window."""
    followed = set(following.values())
    chains = []
    for root in sorted(k for k in following if k not in followed):
        chain: list[dict[str, Any]] = []
        key: tuple[Any, ...] | None = root
        seen: set[tuple[Any, ...]] = set()
        while key is not None and key not in seen:
            seen.add(key)
            chain.append(jobs[key])
            key = following.get(key)
        if any(job["in_window"] for job in chain):
            chains.append(chain)
    return chains


def _count_chains(groups: dict[str, list[dict[str, Any]]], chains: list[list[dict[str, Any]]]) -> None:
    counts: dict[tuple[str, str, str], int] = {}
    for chain in chains:
        first = chain[0]
        for group, field in (("by_account", "account"), ("by_user", "user")):
            key = (group, first["cluster"], first[field])
            counts[key] = counts.get(key, 0) + 1
    for group, field in (("by_account", "account"), ("by_user", "user")):
        for row in groups[group]:
            row["chains"] = counts.get((group, row["cluster"], row[field]), 0)


def _chain_row(chain: list[dict[str, Any]]) -> dict[str, Any]:
    first, last = chain[0], chain[-1]
    ends = [j["end_at"] for j in chain if j["end_at"] is not None]
    return {
        "cluster": first["cluster"],
        "user": first["user"],
        "account": first["account"],
        "partition": first["partition"],
        "name": first["name"],
        "jobs": len(chain),
        "job_ids": [j["job_id"] for j in chain],
        "outcomes": [j["outcome"] for j in chain],
        "failed_jobs": sum(1 for j in chain if j["outcome"] in ("user_failure", "system_failure")),
        "requeues": sum(int(j["requeues"]) for j in chain),
        "resubmissions": len(chain) - 1,
        "first_submit_at": first["job_submit_at"],
        "last_end_at": max(ends) if last["end_at"] is not None and ends else None,
        "retry_gpu_hours": hours(sum(float(j["retry_gpu_seconds"]) for j in chain)),
        "failed_gpu_hours": hours(sum(float(j["failed_gpu_seconds"]) for j in chain)),
    }
