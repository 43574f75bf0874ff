"""The researcher's views: one job (`slurmtel job`) and one user's month (`slurmtel me`).

Every query takes the caller's Scope (slurmtel_in_scope): a job outside it is not found, exactly like a
job that does not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from slurmtel.access import Scope
from slurmtel.filters import JOB_ID, JobFilter
from slurmtel.jobrows import GpuFigures, UtilWindow
from slurmtel.store.efficiency import AttemptEfficiency, efficiency_from_row
from slurmtel.store.sql import Connection, text

AttemptKey = tuple[str, int, datetime]


@dataclass(frozen=True)
class AttemptView:
    cluster: str
    job_id_raw: int
    submit_at: datetime
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    state: str
    outcome: str
    exit_code: str
    eligible_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    alloc_gpus: int
    gpu_model: str
    nodes: tuple[str, ...]
    attempt_number: int
    attempts: int
    time_limit_seconds: int | None

    @property
    def key(self) -> AttemptKey:
        return (self.cluster, self.job_id_raw, self.submit_at)


@dataclass(frozen=True)
class AttemptRead:
    """One attempt as `slurmtel job` reads it: the attempt, its host-side figures
    (slurmtel.store.efficiency) and whether it has a cgroup window while it ran (its checkpoint
    estimate is None without one: slurmtel.store.hostside.checkpoint_estimate)."""

    attempt: AttemptView
    efficiency: AttemptEfficiency
    cgroup_measured: bool


def find_attempts(
    conn: Connection, job_id: str, *, scope: Scope, clusters: Sequence[str] = ()
) -> list[AttemptView]:
    """Every attempt of the job(s) a user means by JOB_ID, newest first, inside SCOPE only.

    JOB_ID matches job_attempt.job_id ("10_4", "123+1", "123") or, when numeric, job_id_raw.
    """
    return [r.attempt for r in read_attempts(conn, job_id, scope=scope, clusters=clusters, now=None)]


def read_attempts(
    conn: Connection, job_id: str, *, scope: Scope, clusters: Sequence[str] = (), now: datetime | None
) -> list[AttemptRead]:
    """find_attempts' attempts, each with its host-side figures (a running attempt's elapsed
    time up to NOW) and whether it has a cgroup window in [its start - 1 minute, its end or
    NOW): one statement for what took three (issue 28)."""
    if not JOB_ID.fullmatch(job_id):
        raise ValueError(f"'{job_id}' is not a job id (forms: 123, 10_4 for an array task, 123+1)")
    raw = int(job_id) if job_id.isdigit() else None
    rows = conn.execute(
        text(
            """
            WITH matched AS (
                -- job_attempt, not the view: no outcome is needed here, and the view's join
                -- was planned for nothing (the statement's planning 0.43 -> 0.36 ms: issue 28)
                SELECT DISTINCT cluster, job_id_raw, coalesce(job_submit_at, submit_at) AS job_submit_at
                FROM job_attempt
                WHERE (job_id = :job_id OR job_id_raw = CAST(:raw AS bigint))
                  AND (cardinality(CAST(:clusters AS text[])) = 0 OR cluster = ANY(CAST(:clusters AS text[])))
                  AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
            )
            SELECT a.*, count(*) OVER (PARTITION BY a.cluster, a.job_id_raw, m.job_submit_at) AS attempts,
                   (a.alloc_tres->>'mem')::bigint AS mem_mb,
                   slurmtel_elapsed_seconds(a.start_at, a.end_at, CAST(:now AS timestamptz)) AS elapsed,
                   a.start_at IS NOT NULL AND EXISTS (
                       SELECT 1 FROM job_host_window j
                       WHERE j.job_id = CAST(a.job_id_raw AS text) AND j.node = ANY (a.nodes)
                         AND j.window_start_at >= a.start_at - interval '1 minute'
                         AND j.window_start_at < coalesce(a.end_at, CAST(:now AS timestamptz))
                   ) AS cgroup_measured
            FROM job_attempt_outcome a
            JOIN matched m ON m.cluster = a.cluster AND m.job_id_raw = a.job_id_raw
                          AND m.job_submit_at = coalesce(a.job_submit_at, a.submit_at)
            WHERE slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
            ORDER BY a.submit_at DESC, a.cluster
            """
        ),
        {"job_id": job_id, "raw": raw, "clusters": list(clusters), "now": now, **scope.sql_params()},
    ).mappings()
    return [
        AttemptRead(
            AttemptView(
                cluster=r["cluster"],
                job_id_raw=int(r["job_id_raw"]),
                submit_at=r["submit_at"],
                job_id=r["job_id"],
                name=r["name"],
                user=r["user_name"],
                account=r["account"],
                partition=r["partition"],
                state=r["state"],
                outcome=r["outcome"],
                exit_code=r["exit_code"],
                eligible_at=r["eligible_at"],
                start_at=r["start_at"],
                end_at=r["end_at"],
                alloc_gpus=int(r["alloc_gpus"]),
                gpu_model=r["gpu_model"],
                nodes=tuple(r["nodes"] or ()),
                attempt_number=int(r["attempt_number"] or 1),
                attempts=int(r["attempts"]),
                time_limit_seconds=r["time_limit_seconds"],
            ),
            efficiency_from_row(r),
            bool(r["cgroup_measured"]),
        )
        for r in rows
    ]


def gpu_figures(
    conn: Connection,
    keys: Sequence[AttemptKey],
    *,
    now: datetime | None = None,
    span: tuple[datetime, datetime] | None = None,
) -> dict[AttemptKey, list[GpuFigures]]:
    """Per attempt, per GPU: see _figures (each attempt's start and end read from job_attempt)."""
    return _figures(conn, keys, None, now=now, span=span, causes=False)[0]


def gpu_figures_and_causes(
    conn: Connection,
    attempts: Sequence[AttemptView],
    *,
    now: datetime | None = None,
    span: tuple[datetime, datetime] | None = None,
) -> tuple[dict[AttemptKey, list[GpuFigures]], dict[AttemptKey, list[dict[str, Any]]]]:
    """gpu_figures of ATTEMPTS (as read_attempts read them: their start and end come with
    them, so job_attempt is not read nor planned again), and reports_idle.attempt_idle_causes
    of the same attempts, in one statement (`slurmtel job`: issue 28)."""
    return _figures(
        conn,
        [a.key for a in attempts],
        [(a.start_at, a.end_at) for a in attempts],
        now=now,
        span=span,
        causes=True,
    )


def _figures(
    conn: Connection,
    keys: Sequence[AttemptKey],
    times: Sequence[tuple[datetime | None, datetime | None]] | None,
    *,
    now: datetime | None,
    span: tuple[datetime, datetime] | None,
    causes: bool,
) -> tuple[dict[AttemptKey, list[GpuFigures]], dict[AttemptKey, list[dict[str, Any]]]]:
    """Per attempt, per GPU (and the unmapped remainder per node), in the order nvidia-smi
    numbers a node's GPUs: gpu_attribution over all days, the GPU's index on its node (the job's
    gpu_allocation, else gpu_inventory), its memory and power limit (gpu_inventory) and its
    highest window mean power during the attempt (its windows; a running attempt up to NOW).

    SPAN, the earliest start and the latest end (NOW for a running one) of the started
    attempts of KEYS, lets the power read be planned for the window partitions of that time
    only (power_max_sql's WITHIN).

    TIMES, each attempt's start and end (in KEYS' order), else read from job_attempt.

    With CAUSES, also each attempt's idle time by cause as attempt_idle_causes gives it (an
    attempt with idle time has GPU rows: its cause columns come with them)."""
    if not keys:
        return {}, {}
    from slurmtel.store.reports_idle import CAUSES, attempt_causes_sql, causes_of_row
    from slurmtel.store.samples import power_max_sql

    # the GPU's highest window mean power while the attempt ran (a running one: up to NOW)
    power_max = power_max_sql(
        "p.gpu_uuid",
        "p.start_at",
        "coalesce(p.end_at, CAST(:now AS timestamptz), now())",
        within=None if span is None else (":within_lo", ":within_hi"),
    )
    within: dict[str, Any] = (
        {} if span is None else {"within_lo": span[0] - timedelta(hours=2), "within_hi": span[1]}
    )
    # the attempts' causes computed once: joined to the GPU rows as a subquery, they were
    # summed again for every GPU row (a nested loop over one estimated row)
    causes_ctes = (
        f"{attempt_causes_sql('wanted', 'cause_')}, causes_once AS MATERIALIZED (SELECT * FROM attempt_causes),"
        if causes
        else ""
    )
    causes_columns = (
        ", ac.cluster IS NOT NULL AS cause_found, " + ", ".join(f"ac.cause_{c}" for c in ("idle", *CAUSES))
        if causes
        else ""
    )
    causes_join = "LEFT JOIN causes_once ac USING (cluster, job_id_raw, submit_at)" if causes else ""
    # the attempts of KEYS with their start and end: given, or read from job_attempt (whose
    # planning, seven indexes, was a sixth of the statement's: issue 28)
    times_params: dict[str, Any] = {}
    unnested = "unnest(CAST(:clusters AS text[]), CAST(:jobs AS bigint[]), CAST(:submits AS timestamptz[])"
    if times is None:
        wanted = f"""SELECT k.*, a.start_at, a.end_at FROM {unnested}) AS k(cluster, job_id_raw, submit_at)
                     LEFT JOIN job_attempt a USING (cluster, job_id_raw, submit_at)"""
    else:
        wanted = f"""SELECT * FROM {unnested}, CAST(:starts AS timestamptz[]), CAST(:ends AS timestamptz[]))
                     AS k(cluster, job_id_raw, submit_at, start_at, end_at)"""
        times_params = {"starts": [t[0] for t in times], "ends": [t[1] for t in times]}
    rows = conn.execute(
        text(
            f"""
            WITH wanted AS ({wanted}),
            {causes_ctes}
            per_gpu AS (
                SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.gpu_uuid, wanted.start_at, wanted.end_at,
                       string_agg(DISTINCT g.mapping, '+') AS mapping,
                       sum(g.allocated_seconds) AS allocated, sum(g.covered_seconds) AS covered,
                       sum(g.idle_seconds) AS idle, sum(g.no_process_seconds) AS no_process,
                       sum(g.unmeasured_seconds) AS unmeasured, sum(g.util_weighted_sum) AS util_weighted,
                       max(g.util_max_percent) AS util_max, max(g.memory_used_max_bytes) AS memory_max,
                       sum(g.energy_joules) AS energy, max(g.gpu_fraction) AS gpu_fraction
                FROM gpu_attribution g JOIN wanted USING (cluster, job_id_raw, submit_at)
                GROUP BY g.cluster, g.job_id_raw, g.submit_at, g.node, g.gpu_uuid, wanted.start_at, wanted.end_at
            )
            SELECT p.*, inv.memory_total_bytes, coalesce(inv.model, '') AS model, inv.power_limit_watts,
                   coalesce(al.gpu_index, inv.gpu_index) AS gpu_index,
                   CASE WHEN p.gpu_uuid <> '' AND p.start_at IS NOT NULL THEN {power_max} END AS power_max
                   {causes_columns}
            FROM per_gpu p
            {causes_join}
            LEFT JOIN LATERAL (
                SELECT i.memory_total_bytes, i.model, i.gpu_index, i.power_limit_watts FROM gpu_inventory i
                WHERE i.gpu_uuid = p.gpu_uuid AND p.gpu_uuid <> ''
                ORDER BY (i.node = p.node) DESC, i.last_seen_at DESC LIMIT 1
            ) inv ON true
            LEFT JOIN LATERAL (
                SELECT x.gpu_index FROM gpu_allocation x
                WHERE x.cluster = p.cluster AND x.job_id_raw = p.job_id_raw AND x.submit_at = p.submit_at
                  AND x.node = p.node AND x.gpu_uuid = p.gpu_uuid AND p.gpu_uuid <> ''
                ORDER BY x.last_seen_at DESC LIMIT 1
            ) al ON true
            -- per node, as nvidia-smi numbers its GPUs; a GPU whose index is unknown after them,
            -- the allocation no GPU could be mapped to last
            ORDER BY p.cluster, p.job_id_raw, p.submit_at, p.node, (p.gpu_uuid = ''),
                     coalesce(al.gpu_index, inv.gpu_index) NULLS LAST, p.gpu_uuid
            """
        ),
        {
            "clusters": [k[0] for k in keys],
            "jobs": [k[1] for k in keys],
            "submits": [k[2] for k in keys],
            "now": now,
            **within,
            **times_params,
        },
    ).mappings()
    result: dict[AttemptKey, list[GpuFigures]] = {k: [] for k in keys}
    idle_causes: dict[AttemptKey, list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["cluster"], int(r["job_id_raw"]), r["submit_at"])
        if causes and r["cause_found"] and key not in idle_causes:
            idle_causes[key] = causes_of_row(r, "cause_")
        result[key].append(
            GpuFigures(
                gpu_uuid=r["gpu_uuid"],
                node=r["node"],
                mapping=r["mapping"],
                allocated_seconds=float(r["allocated"]),
                covered_seconds=float(r["covered"]),
                idle_seconds=float(r["idle"]),
                no_process_seconds=float(r["no_process"]),
                unmeasured_seconds=float(r["unmeasured"]),
                util_weighted_sum=float(r["util_weighted"]),
                util_max_percent=None if r["util_max"] is None else float(r["util_max"]),
                memory_used_max_bytes=None if r["memory_max"] is None else int(r["memory_max"]),
                energy_joules=None if r["energy"] is None else float(r["energy"]),
                memory_total_bytes=None if r["memory_total_bytes"] is None else int(r["memory_total_bytes"]),
                gpu_fraction=float(r["gpu_fraction"]),
                model=r["model"],
                gpu_index=None if r["gpu_index"] is None else int(r["gpu_index"]),
                power_max_watts=None if r["power_max"] is None else float(r["power_max"]),
                power_limit_watts=None if r["power_limit_watts"] is None else float(r["power_limit_watts"]),
            )
        )
    return result, idle_causes


def util_windows(
    conn: Connection,
    gpu_uuids: Sequence[str],
    *,
    start: datetime,
    end: datetime,
    slice_seconds: float | None = None,
) -> list[UtilWindow]:
    """The windows of GPU_UUIDS that overlap [START, END): utilisation, memory, power. With
    SLICE_SECONDS, one row per GPU, source and slice of that length from START instead: the
    highest utilisation, memory and power of the windows starting in it (a spike stays
    visible), the slice's start and length; a slice without windows has no row."""
    if not gpu_uuids:
        return []
    params = {"uuids": list(gpu_uuids), "start": start, "end": end}
    if slice_seconds is None:
        sql = """
            SELECT gpu_uuid, window_start_at, window_seconds, util_mean_percent, source,
                   memory_used_max_bytes, power_mean_watts
            FROM slurmtel_gpu_windows(CAST(:uuids AS text[]), CAST(:start AS timestamptz), CAST(:end AS timestamptz))
            ORDER BY gpu_uuid, window_start_at, source
            """
    else:
        params["slice"] = slice_seconds
        sql = """
            SELECT gpu_uuid, CAST(:start AS timestamptz) + make_interval(secs => k * :slice) AS window_start_at,
                   CAST(:slice AS double precision) AS window_seconds, max(util_mean_percent) AS util_mean_percent,
                   source, max(memory_used_max_bytes) AS memory_used_max_bytes,
                   max(power_mean_watts) AS power_mean_watts
            FROM (
                SELECT w.*, GREATEST(floor(extract(epoch FROM w.window_start_at - CAST(:start AS timestamptz)) / :slice), 0) AS k
                FROM slurmtel_gpu_windows(CAST(:uuids AS text[]), CAST(:start AS timestamptz), CAST(:end AS timestamptz)) w
            ) sliced
            GROUP BY gpu_uuid, source, k
            ORDER BY gpu_uuid, k, source
            """
    rows = conn.execute(text(sql), params)
    return [
        UtilWindow(
            gpu_uuid=r.gpu_uuid,
            window_start_at=r.window_start_at,
            window_seconds=float(r.window_seconds),
            util_mean_percent=None if r.util_mean_percent is None else float(r.util_mean_percent),
            source=r.source,
            memory_used_max_bytes=None if r.memory_used_max_bytes is None else int(r.memory_used_max_bytes),
            power_mean_watts=None if r.power_mean_watts is None else float(r.power_mean_watts),
        )
        for r in rows
    ]


def gpu_events(
    conn: Connection, gpu_uuids: Sequence[str], *, start: datetime, end: datetime
) -> list[dict[str, Any]]:
    """The XID and ECC events of GPU_UUIDS in [START, END), oldest first."""
    if not gpu_uuids:
        return []
    rows = conn.execute(
        text(
            """
            SELECT at, gpu_uuid, node, kind, value, detail FROM gpu_event
            WHERE gpu_uuid = ANY(CAST(:uuids AS text[])) AND at >= :start AND at < :end
            ORDER BY at, gpu_uuid, kind
            """
        ),
        {"uuids": list(gpu_uuids), "start": start, "end": end},
    )
    return [
        {
            "event_at": r.at,
            "gpu_uuid": r.gpu_uuid,
            "node": r.node,
            "event_kind": r.kind,
            "event_value": int(r.value),
            "event_detail": r.detail,
        }
        for r in rows
    ]


def running_gpus_in_scope(
    conn: Connection, *, scope: Scope, now: datetime, running_states: Sequence[str]
) -> list[dict[str, Any]]:
    """Every GPU attribution mapped to a running attempt in SCOPE at NOW (one row per attempt
    and GPU: the attempt's job, user, account, partition, start and GPUs, the GPU's node, UUID
    and index), by start then job."""
    rows = conn.execute(
        text(
            """
            WITH running AS MATERIALIZED (
                SELECT a.cluster, a.job_id_raw, a.submit_at, a.job_id, a.name, a.user_name, a.account,
                       a.partition, a.start_at, a.alloc_gpus
                FROM job_attempt a
                WHERE a.end_at IS NULL AND a.start_at IS NOT NULL AND a.start_at <= CAST(:now AS timestamptz)
                  AND a.alloc_gpus > 0 AND a.state = ANY(CAST(:running AS text[]))
                  AND slurmtel_in_scope(a.user_name, a.account, :scope_all, :scope_users, :scope_accounts)
            ),
            gpus AS (
                SELECT DISTINCT g.cluster, g.job_id_raw, g.submit_at, g.node, g.gpu_uuid
                FROM gpu_attribution g JOIN running r USING (cluster, job_id_raw, submit_at)
                WHERE g.mapping <> 'unmapped' AND g.gpu_uuid <> ''
            ),
            indices AS (
                SELECT DISTINCT ON (i.node, i.gpu_uuid) i.node, i.gpu_uuid, i.gpu_index
                FROM gpu_inventory i WHERE i.gpu_uuid IN (SELECT gpu_uuid FROM gpus)
                ORDER BY i.node, i.gpu_uuid, i.last_seen_at DESC
            )
            SELECT r.cluster, r.job_id, r.name, r.user_name, r.account, r.partition, r.start_at, r.alloc_gpus,
                   g.node, g.gpu_uuid, inv.gpu_index
            FROM running r JOIN gpus g USING (cluster, job_id_raw, submit_at)
            LEFT JOIN indices inv ON inv.node = g.node AND inv.gpu_uuid = g.gpu_uuid
            ORDER BY r.start_at, r.cluster, r.job_id_raw, g.node, inv.gpu_index, g.gpu_uuid
            """
        ),
        {"now": now, "running": list(running_states), **scope.sql_params()},
    ).mappings()
    return [dict(r) for r in rows]


# --------------------------------------------------------------------------------- slurmtel me


# the user's attempts in the window, as `report usage` counts them (parameters: _user_window_params)
_USER_ATTEMPTS = (
    "SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, "
    ":scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)"
)


def _user_window_params(
    user: str, start: datetime, end: datetime, first_day: date, end_day: date, now: datetime, scope: Scope
) -> dict[str, Any]:
    """The parameters of slurmtel_windowed_attempts for USER's attempts in [START, END), the site
    days [FIRST_DAY, END_DAY) as :first and :end_day, and USER as :user."""
    params: dict[str, Any] = {
        "start": start,
        "end": end,
        "now": now,
        "first": first_day,
        "end_day": end_day,
        "user": user,
    }
    params.update(scope.sql_params())
    params.update(JobFilter(users=(user,)).sql_params())
    return params


def month_summary(
    conn: Connection,
    *,
    user: str,
    start: datetime,
    end: datetime,
    first_day: date,
    end_day: date,
    now: datetime,
    scope: Scope,
) -> dict[str, Any]:
    """USER's GPU use in [START, END) (site days [FIRST_DAY, END_DAY) for the telemetry)."""
    params = _user_window_params(user, start, end, first_day, end_day, now, scope)
    usage = (
        conn.execute(
            text(
                f"""
            WITH w AS ({_USER_ATTEMPTS})
            SELECT count(DISTINCT (cluster, job_id_raw, coalesce(job_submit_at, submit_at))) AS jobs,
                   count(*) AS attempts,
                   coalesce(sum(gpu_seconds), 0) AS gpu_seconds,
                   coalesce(sum(gpu_seconds) FILTER (WHERE outcome IN ('user_failure', 'system_failure')), 0)
                       AS failed_gpu_seconds
            FROM w
            """
            ),
            params,
        )
        .mappings()
        .one()
    )
    telemetry = (
        conn.execute(
            text(
                """
            SELECT coalesce(sum(g.allocated_seconds), 0) AS allocated,
                   coalesce(sum(g.covered_seconds), 0) AS covered,
                   coalesce(sum(g.idle_seconds), 0) AS idle,
                   coalesce(sum(g.unmeasured_seconds), 0) AS unmeasured,
                   coalesce(sum(g.util_weighted_sum), 0) AS util_weighted,
                   sum(g.energy_joules) AS energy
            FROM gpu_attribution g
            JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
            WHERE g.day >= :first AND g.day < :end_day AND a.user_name = :user AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
            """
            ),
            params,
        )
        .mappings()
        .one()
    )
    return {**dict(usage), **{f"t_{k}": v for k, v in telemetry.items()}}


def top_jobs(
    conn: Connection,
    *,
    user: str,
    start: datetime,
    end: datetime,
    first_day: date,
    end_day: date,
    now: datetime,
    scope: Scope,
    limit: int,
) -> list[dict[str, Any]]:
    """USER's jobs with the most GPU-seconds in [START, END), with their idle share there."""
    params = {**_user_window_params(user, start, end, first_day, end_day, now, scope), "limit": limit}
    rows = conn.execute(
        text(
            f"""
            WITH w AS ({_USER_ATTEMPTS}),
            jobs AS (
                SELECT cluster, job_id_raw, coalesce(job_submit_at, submit_at) AS jsa,
                       (array_agg(job_id ORDER BY submit_at DESC))[1] AS job_id,
                       (array_agg(name ORDER BY submit_at DESC))[1] AS name,
                       (array_agg(account ORDER BY submit_at DESC))[1] AS account,
                       (array_agg(state ORDER BY submit_at DESC))[1] AS state,
                       max(alloc_gpus) AS gpus, count(*) AS attempts, sum(gpu_seconds) AS gpu_seconds
                FROM w GROUP BY cluster, job_id_raw, coalesce(job_submit_at, submit_at)
                HAVING sum(gpu_seconds) > 0
                ORDER BY sum(gpu_seconds) DESC, max(submit_at) DESC
                LIMIT :limit
            ),
            telemetry AS (
                SELECT a.cluster, a.job_id_raw, coalesce(a.job_submit_at, a.submit_at) AS jsa,
                       sum(g.allocated_seconds) AS allocated, sum(g.covered_seconds) AS covered,
                       sum(g.idle_seconds) AS idle, sum(g.util_weighted_sum) AS util_weighted
                FROM gpu_attribution g
                JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
                JOIN jobs j ON j.cluster = a.cluster AND j.job_id_raw = a.job_id_raw
                           AND j.jsa = coalesce(a.job_submit_at, a.submit_at)
                WHERE g.day >= :first AND g.day < :end_day
                GROUP BY a.cluster, a.job_id_raw, coalesce(a.job_submit_at, a.submit_at)
            )
            SELECT j.*, t.allocated, t.covered, t.idle, t.util_weighted
            FROM jobs j LEFT JOIN telemetry t USING (cluster, job_id_raw, jsa)
            ORDER BY j.gpu_seconds DESC, j.jsa DESC
            """
        ),
        params,
    ).mappings()
    return [dict(r) for r in rows]


def user_attempts(
    conn: Connection,
    *,
    user: str,
    start: datetime,
    end: datetime,
    first_day: date,
    end_day: date,
    now: datetime,
    scope: Scope,
) -> list[dict[str, Any]]:
    """Every attempt of USER that overlaps [START, END), oldest first: its GPU-seconds inside the
    window, its telemetry there (site days [FIRST_DAY, END_DAY)) and, as "efficiency", its
    host-side figures (whole attempt; slurmtel.store.efficiency)."""
    from slurmtel.store.efficiency import efficiency_from_row

    params = _user_window_params(user, start, end, first_day, end_day, now, scope)
    rows = conn.execute(
        text(
            f"""
            WITH w AS ({_USER_ATTEMPTS}),
            telemetry AS (
                SELECT g.cluster, g.job_id_raw, g.submit_at,
                       sum(g.allocated_seconds) AS allocated, sum(g.covered_seconds) AS covered,
                       sum(g.idle_seconds) AS idle, sum(g.util_weighted_sum) AS util_weighted
                FROM gpu_attribution g JOIN w USING (cluster, job_id_raw, submit_at)
                WHERE g.day >= :first AND g.day < :end_day
                GROUP BY g.cluster, g.job_id_raw, g.submit_at
            )
            SELECT a.cluster, a.job_id_raw, a.submit_at, a.job_id, a.state, a.alloc_cpus,
                   a.time_limit_seconds, a.cpu_time_seconds, a.mem_peak_task_bytes,
                   a.mem_peak_step_bytes, a.usage_steps, (a.alloc_tres->>'mem')::bigint AS mem_mb,
                   slurmtel_elapsed_seconds(a.start_at, a.end_at, :now) AS elapsed, a.name, a.account, a.partition, a.start_at, a.end_at,
                   a.attempt_number, a.alloc_gpus, a.gpu_seconds,
                   t.allocated, t.covered, t.idle, t.util_weighted
            FROM w a LEFT JOIN telemetry t USING (cluster, job_id_raw, submit_at)
            ORDER BY coalesce(a.start_at, a.submit_at), a.cluster, a.job_id_raw, a.submit_at
            """
        ),
        params,
    ).mappings()
    return [{**dict(r), "efficiency": efficiency_from_row(r)} for r in rows]
