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

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.access import SCOPE_SQL, Scope
from slurmtel.store.jobs import REQUEUE_STATES
from slurmtel.store.reports_admin import FAILED_SQL, hours, no_jit, params
from slurmtel.store.usage import FILTER_SQL, WINDOWED_ATTEMPTS_SQL, JobFilter

DEFAULT_RESUBMISSION_WINDOW_SECONDS = 21600

_W = "make_interval(secs => CAST(:resubmission_seconds AS float8))"
_REQUEUE_SQL = "(" + ", ".join(f"'{s}'" for s in REQUEUE_STATES) + ")"
# the columns of windowed attempts the retry CTEs (and the reports using them) read
WINDOWED_COLUMNS = (
    "cluster, job_id_raw, submit_at, job_submit_at, attempt_number, job_id, name, user_name, account, "
    "partition, state, outcome, exit_code, nodelist, nodes, alloc_gpus, start_at, end_at, gpu_seconds"
)
# a windowed-attempts CTE body with only the columns the admin reports read (the full rows
# are wide: materialising 200,000 of them costs more than the rest of a report)
WINDOWED_SQL = f"SELECT {WINDOWED_COLUMNS} FROM ({WINDOWED_ATTEMPTS_SQL}) windowed_attempt"

# An attempt of the same job after this one (link_jobs only continues a job after a requeue state).
_LATER_ATTEMPT = """EXISTS (
    SELECT 1 FROM job_attempt n
    WHERE n.cluster = {a}.cluster AND n.job_id_raw = {a}.job_id_raw
      AND n.job_submit_at = {a}.job_submit_at AND n.attempt_number > {a}.attempt_number)"""


def _requeued(alias: str) -> str:
    later = _LATER_ATTEMPT.format(a=alias)
    return f"(CASE WHEN {alias}.state IN {_REQUEUE_SQL} THEN {later} ELSE false END)"


# CTEs after a CTE `w` (WINDOWED_SQL rows). They define retry_link (a resubmission -> the failed
# job it follows), retry_chain_job (jobs in a chain) and retry_attempt (keys of the windowed
# attempts that are retry attempts). Same scope and filter as w; :retry_lo and :retry_hi come
# from retry_bounds() (literal bounds let the planner hash-join the jobs; bounds computed in
# the same statement leave it guessing, and it guessed a nested loop over 200,000 x 40,000 rows).
RETRY_CTES = f"""
    retry_job_start AS (
        SELECT a.cluster, a.job_id_raw, a.submit_at AS job_submit_at, a.user_name, a.account,
               a.partition, a.name
        FROM job_attempt a
        WHERE coalesce(a.attempt_number, 1) = 1
          AND a.submit_at >= CAST(:retry_lo AS timestamptz) AND a.submit_at <= CAST(:retry_hi AS timestamptz)
          AND {SCOPE_SQL}
          AND {FILTER_SQL}
    ),
    retry_failed_job AS (
        SELECT a.cluster, a.job_id_raw, coalesce(a.job_submit_at, a.submit_at) AS job_submit_at,
               a.user_name, a.account, a.partition, a.name, a.end_at
        FROM job_attempt a
        WHERE a.state IN (SELECT state FROM outcome_class WHERE outcome IN {FAILED_SQL})
          AND a.end_at >= CAST(:retry_lo AS timestamptz) AND a.end_at <= CAST(:retry_hi AS timestamptz)
          AND NOT {_requeued("a")}
          AND {SCOPE_SQL}
          AND {FILTER_SQL}
    ),
    retry_follows AS (
        SELECT DISTINCT ON (s.cluster, s.job_id_raw, s.job_submit_at)
               s.cluster, s.job_id_raw, s.job_submit_at,
               p.job_id_raw AS prev_job_id_raw, p.job_submit_at AS prev_job_submit_at
        FROM retry_job_start s
        JOIN retry_failed_job p
          ON p.cluster = s.cluster AND p.user_name = s.user_name AND p.account = s.account
         AND p.partition = s.partition AND p.name = s.name
         AND s.job_submit_at >= p.end_at AND s.job_submit_at <= p.end_at + {_W}
         AND (p.job_id_raw, p.job_submit_at) <> (s.job_id_raw, s.job_submit_at)
        ORDER BY s.cluster, s.job_id_raw, s.job_submit_at, p.end_at DESC, p.job_id_raw DESC
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


def retry_bounds(conn: Connection, bind: dict[str, Any]) -> dict[str, Any]:
    """:retry_lo and :retry_hi for RETRY_CTES: from one resubmission window before the earliest
    submission of a job active in the window to one after the latest end of such a job. BIND
    holds the windowed attempts' parameters (window, now, scope, filter, resubmission_seconds)."""
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
        WITH w AS ({WINDOWED_SQL}),
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
               NULL::jsonb AS detail
        FROM job_window j LEFT JOIN retry_link l USING (cluster, job_id_raw, job_submit_at)
        GROUP BY GROUPING SETS ((j.cluster, j.account), (j.cluster, j.user_name))
        UNION ALL
        SELECT 'link', cluster, NULL, NULL, NULL, NULL, NULL, NULL,
               jsonb_build_object('prev', jsonb_build_array(prev_job_id_raw, prev_job_submit_at),
                                  'next', jsonb_build_array(job_id_raw, job_submit_at))
        FROM retry_link
        UNION ALL
        SELECT 'job', c.cluster, NULL, NULL, NULL, NULL, jw.retry_gpu_seconds, jw.failed_gpu_seconds,
               jsonb_build_object(
                   'key', jsonb_build_array(c.job_id_raw, c.job_submit_at), 'job_id', c.job_id,
                   'user', c.user_name, 'account', c.account, 'partition', c.partition, 'name', c.name,
                   'outcome', c.outcome, 'end_at', c.end_at, 'requeues', c.attempts - 1,
                   'in_window', jw.job_id_raw IS NOT NULL, 'visible', c.visible)
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
    bind.update(retry_bounds(conn, bind))
    groups: dict[str, list[dict[str, Any]]] = {"by_account": [], "by_user": []}
    following: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    jobs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in conn.execute(text(sql), bind).mappings():
        kind, d = r["kind"], r["detail"]
        if kind == "link":
            following[_key(r["cluster"], d["prev"])] = _key(r["cluster"], d["next"])
        elif kind == "job":
            jobs[_key(r["cluster"], d["key"])] = {
                **d,
                "cluster": r["cluster"],
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


def _key(cluster: str, pair: list[Any]) -> tuple[Any, ...]:
    return (cluster, int(pair[0]), _utc(pair[1]))


def _utc(value: Any) -> datetime:
    """jsonb renders timestamps as text in the session's zone; compare them in UTC."""
    return datetime.fromisoformat(str(value)).astimezone(UTC)


def _chains(
    following: dict[tuple[Any, ...], tuple[Any, ...]], jobs: dict[tuple[Any, ...], dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """Chains (lists of jobs in order) that have a job active in the window."""
    followed = set(following.values())
    chains = []
    for root in sorted(k for k in following if k not in followed):
        chain, key, seen = [], root, set()
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
    ends = [_utc(j["end_at"]) for j in chain if j["end_at"] is not None]
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
        "first_submit_at": _key(first["cluster"], first["key"])[2],
        "last_end_at": max(ends) if last["end_at"] is not None and ends else None,
        "retry_gpu_hours": hours(sum(float(j["retry_gpu_seconds"]) for j in chain)),
        "failed_gpu_hours": hours(sum(float(j["failed_gpu_seconds"]) for j in chain)),
    }
