"""The SQL of acting on what slurmtel measures (migration 0017, slurmtel.actions).

- Idle stretches: fold_streaks folds the windows of every telemetry batch not folded in yet
  into action_gpu_streak, per GPU and source: where the current stretch of idle windows (and of
  windows with no process on the GPU) began, the newest window's end, and the highest
  utilisation and memory use inside the stretch. A window is idle when all of its covered time
  was below the idle threshold (its idle seconds, as the agent or the DCGM source counted them)
  and its memory use stayed at or below IDLE_MEMORY_MAX_BYTES; a window not idle, or a gap of
  more than two windows before it (unmeasured time, DESIGN §4), starts a new stretch. A window
  that ends before the GPU's newest folded one changes nothing (late data never lengthens a
  stretch). running_gpus reads, per running attempt and GPU it is mapped to (the attribution's
  mapping), the freshest stretch.
- The record: insert_action writes a decision once per (rule, subject, step), with its
  deliveries; the delivery functions move a delivery through its states with compare-and-set
  updates (only one process ever holds a delivery), see slurmtel.actions.deliver.
- Exclusions, MailProg requests, the action log as a caller may read it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurmtel.access import Scope
from slurmtel.store.sql import Connection, text

# ------------------------------------------------------------------ idle stretches


@dataclass(frozen=True)
class FoldStats:
    batches: int
    windows: int
    gpus: int


def fold_streaks(
    conn: Connection, *, now: datetime, idle_memory_max_bytes: int, horizon_seconds: float
) -> FoldStats:
    """Fold every telemetry batch no earlier call folded in (its windows from HORIZON_SECONDS
    before NOW on: older ones cannot end a stretch a rule would still see) into
    action_gpu_streak, and mark the batches folded."""
    batch = conn.execute(
        text(
            """
            SELECT array_agg(b.id ORDER BY b.id), min(b.window_min_at), max(b.window_max_at)
            FROM ingest_batch b
            WHERE NOT EXISTS (SELECT 1 FROM action_batch p WHERE p.batch_id = b.id)
            """
        )
    ).one()
    ids = [int(i) for i in batch[0] or ()]
    if not ids:
        return FoldStats(0, 0, 0)
    lo, hi = batch[1], batch[2]
    result = None
    if lo is not None and hi is not None:
        # a sort of the new windows in memory (one of 100,000 windows spilled to disk at 4 MB);
        # and hash joins: the stretches table is rewritten every run, so its statistics lag, and
        # a nested loop over it that the planner thought small took 10 s at 10,000 GPUs
        conn.execute(text("SET LOCAL work_mem = '64MB'"))
        conn.execute(text("SET LOCAL enable_nestloop = off"))
        result = conn.execute(
            text(_FOLD),
            {
                "ids": ids,
                "lo": max(lo, _minus(now, horizon_seconds)),
                "hi": _plus(hi, 3600),
                "mem": int(idle_memory_max_bytes),
            },
        ).one()
        conn.execute(text("RESET enable_nestloop"))
    conn.execute(
        text(
            "INSERT INTO action_batch (batch_id) SELECT unnest(CAST(:ids AS bigint[])) ON CONFLICT DO NOTHING"
        ),
        {"ids": ids},
    )
    windows, gpus = (int(result[0] or 0), int(result[1] or 0)) if result is not None else (0, 0)
    return FoldStats(len(ids), windows, gpus)


def _minus(at: datetime, seconds: float) -> datetime:
    from datetime import timedelta

    return at - timedelta(seconds=seconds)


def _plus(at: datetime, seconds: float) -> datetime:
    from datetime import timedelta

    return at + timedelta(seconds=seconds)


# The fold. A GPU's current idle stretch began at the end of its newest window that was not
# idle, or later, at the newest idle window after it that follows a gap (or, when its new
# windows hold neither, where its stored stretch began). So the new windows are aggregated per
# GPU without an order (the newest end, the newest end of a busy window), and only the idle
# windows after the newest busy one - few, on a cluster whose GPUs mostly work - are sorted
# to find gaps and the stretch's maxima. The same for windows with no process on the GPU.
_FOLD = """
WITH stored AS MATERIALIZED (
    SELECT gpu_uuid, source, last_window_end_at, idle_since_at, no_process_since_at,
           idle_util_max_percent, idle_memory_used_max_bytes
    FROM action_gpu_streak
),
raw AS NOT MATERIALIZED (
    -- windows that end after the GPU's newest folded one (late ones change nothing)
    SELECT s.gpu_uuid, s.source, s.node, s.window_seconds, s.window_start_at AS t0,
           s.window_start_at + make_interval(secs => s.window_seconds) AS t1,
           s.covered_seconds > 0
               AND s.idle_seconds >= s.covered_seconds - 0.001 * s.window_seconds
               AND coalesce(s.memory_used_max_bytes, 0) <= :mem AS idle,
           s.no_process_seconds IS NOT NULL AS knows_process,
           s.covered_seconds > 0 AND s.no_process_seconds IS NOT NULL
               AND s.no_process_seconds >= s.covered_seconds - 0.001 * s.window_seconds AS no_process,
           s.util_max_percent, s.memory_used_max_bytes
    FROM slurmtel_batch_windows(CAST(:ids AS bigint[]), CAST(:lo AS timestamptz), CAST(:hi AS timestamptz)) s
    LEFT JOIN stored st ON st.gpu_uuid = s.gpu_uuid AND st.source = s.source
    WHERE st.last_window_end_at IS NULL
       OR s.window_start_at + make_interval(secs => s.window_seconds) > st.last_window_end_at
),
per_gpu AS MATERIALIZED (
    SELECT n.gpu_uuid, n.source, max(n.node) AS node, max(n.window_seconds) AS window_seconds,
           max(n.t1) AS last_end, count(*) AS windows, bool_or(n.knows_process) AS knows_process,
           max(n.t1) FILTER (WHERE NOT n.idle) AS last_busy,
           max(n.t1) FILTER (WHERE NOT n.no_process) AS last_process
    FROM raw n GROUP BY n.gpu_uuid, n.source
),
-- the windows that may be in a stretch (read again rather than keeping every window)
new AS MATERIALIZED (
    SELECT * FROM raw WHERE idle OR no_process
),
-- the idle (process-less) windows after the newest one that was not, each with the end of the
-- window before it (the busy one, or the stored newest one for the first)
idle_tail AS (
    SELECT n.gpu_uuid, n.source, n.t0, n.util_max_percent, n.memory_used_max_bytes,
           n.t0 - coalesce(lag(n.t1) OVER (PARTITION BY n.gpu_uuid, n.source ORDER BY n.t0, n.t1),
                           p.last_busy, st.last_window_end_at)
               > make_interval(secs => 2 * n.window_seconds) IS NOT FALSE AS gap
    FROM new n JOIN per_gpu p ON p.gpu_uuid = n.gpu_uuid AND p.source = n.source
    LEFT JOIN stored st ON st.gpu_uuid = n.gpu_uuid AND st.source = n.source
    WHERE n.idle AND n.t0 >= coalesce(p.last_busy, '-infinity')
),
process_tail AS (
    SELECT n.gpu_uuid, n.source,
           n.t0 - coalesce(lag(n.t1) OVER (PARTITION BY n.gpu_uuid, n.source ORDER BY n.t0, n.t1),
                           p.last_process, st.last_window_end_at)
               > make_interval(secs => 2 * n.window_seconds) IS NOT FALSE AS gap, n.t0
    FROM new n JOIN per_gpu p ON p.gpu_uuid = n.gpu_uuid AND p.source = n.source
    LEFT JOIN stored st ON st.gpu_uuid = n.gpu_uuid AND st.source = n.source
    WHERE n.no_process AND n.t0 >= coalesce(p.last_process, '-infinity')
),
idle_gap AS (
    SELECT gpu_uuid, source, max(t0) FILTER (WHERE gap) AS since FROM idle_tail GROUP BY gpu_uuid, source
),
process_gap AS (
    SELECT gpu_uuid, source, max(t0) FILTER (WHERE gap) AS since FROM process_tail GROUP BY gpu_uuid, source
),
stretch AS (
    SELECT p.*, coalesce(ig.since, p.last_busy, st.idle_since_at) AS idle_since,
           CASE WHEN p.knows_process THEN coalesce(pg.since, p.last_process, st.no_process_since_at) END
               AS no_process_since,
           -- no busy window and no gap: the stored stretch goes on, its maxima count too
           p.last_busy IS NULL AND ig.since IS NULL AND st.gpu_uuid IS NOT NULL AS continues,
           st.idle_util_max_percent AS stored_util, st.idle_memory_used_max_bytes AS stored_memory
    FROM per_gpu p
    LEFT JOIN idle_gap ig ON ig.gpu_uuid = p.gpu_uuid AND ig.source = p.source
    LEFT JOIN process_gap pg ON pg.gpu_uuid = p.gpu_uuid AND pg.source = p.source
    LEFT JOIN stored st ON st.gpu_uuid = p.gpu_uuid AND st.source = p.source
),
maxima AS (
    SELECT t.gpu_uuid, t.source, max(t.util_max_percent) AS util_max, max(t.memory_used_max_bytes) AS memory_max
    FROM idle_tail t JOIN stretch s ON s.gpu_uuid = t.gpu_uuid AND s.source = t.source
    WHERE t.t0 >= s.idle_since
    GROUP BY t.gpu_uuid, t.source
),
written AS (
    INSERT INTO action_gpu_streak AS t (gpu_uuid, source, node, window_seconds, last_window_end_at,
        idle_since_at, no_process_since_at, idle_util_max_percent, idle_memory_used_max_bytes, updated_at)
    SELECT s.gpu_uuid, s.source, s.node, s.window_seconds, s.last_end,
           -- a stretch never starts after the newest window's end (a busy window: length 0)
           least(s.idle_since, s.last_end),
           least(s.no_process_since, s.last_end),
           CASE WHEN s.continues THEN greatest(s.stored_util, m.util_max) ELSE m.util_max END,
           CASE WHEN s.continues THEN greatest(s.stored_memory, m.memory_max) ELSE m.memory_max END,
           now()
    FROM stretch s LEFT JOIN maxima m ON m.gpu_uuid = s.gpu_uuid AND m.source = s.source
    -- rows locked in one order: a dry run's fold beside the daemon's waits, never deadlocks
    ORDER BY s.gpu_uuid, s.source
    ON CONFLICT (gpu_uuid, source) DO UPDATE
    SET node = EXCLUDED.node, window_seconds = EXCLUDED.window_seconds,
        last_window_end_at = EXCLUDED.last_window_end_at, idle_since_at = EXCLUDED.idle_since_at,
        no_process_since_at = EXCLUDED.no_process_since_at,
        idle_util_max_percent = EXCLUDED.idle_util_max_percent,
        idle_memory_used_max_bytes = EXCLUDED.idle_memory_used_max_bytes, updated_at = now()
    RETURNING 1
)
SELECT (SELECT coalesce(sum(windows), 0) FROM per_gpu), (SELECT count(*) FROM written)
"""


@dataclass(frozen=True)
class RunningGpu:
    """One GPU a running attempt is mapped to, and its current stretches (None: no windows)."""

    node: str
    gpu_uuid: str
    gpu_index: int | None
    mapping: str
    source: str | None
    last_window_end_at: datetime | None
    idle_since_at: datetime | None
    no_process_since_at: datetime | None
    idle_util_max_percent: float | None
    idle_memory_used_max_bytes: int | None


@dataclass(frozen=True)
class RunningAttempt:
    cluster: str
    job_id_raw: int
    submit_at: datetime
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    start_at: datetime
    time_limit_seconds: int | None
    alloc_gpus: int
    gpu_model: str
    submit_line: str
    nodes: tuple[str, ...]
    billing: int
    gpus: list[RunningGpu] = field(default_factory=list)


def running_gpus(
    conn: Connection, *, now: datetime, fresh_after: datetime, running_states: Sequence[str]
) -> list[RunningAttempt]:
    """Every running attempt with GPUs, with the GPUs attribution mapped it to and, per GPU, the
    stretch of the source with the freshest news (windows ending after FRESH_AFTER first, the
    agent before DCGM, which cannot tell process-less GPUs)."""
    params = {"now": now, "fresh": fresh_after, "running": list(running_states)}
    attempts: dict[tuple[str, int, datetime], RunningAttempt] = {}
    for r in conn.execute(text(f"{_RUNNING} SELECT * FROM running"), params):
        attempts[(r[0], int(r[1]), r[2])] = RunningAttempt(
            cluster=r[0],
            job_id_raw=int(r[1]),
            submit_at=r[2],
            job_id=r[3],
            name=r[4],
            user=r[5],
            account=r[6],
            partition=r[7],
            qos=r[8],
            state=r[9],
            start_at=r[10],
            time_limit_seconds=r[11],
            alloc_gpus=int(r[12]),
            gpu_model=r[13],
            submit_line=r[14],
            nodes=tuple(r[15] or ()),
            billing=int(r[16]),
        )
    if not attempts:
        return []
    # hash joins (as in fold_streaks: the stretches' statistics lag behind the table)
    conn.execute(text("SET LOCAL enable_nestloop = off"))
    rows = conn.execute(
        text(
            f"""
            {_RUNNING},
            gpus AS MATERIALIZED (
                SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.gpu_uuid,
                       string_agg(DISTINCT g.mapping, '+') AS mapping
                FROM gpu_attribution g JOIN running r USING (cluster, job_id_raw, submit_at)
                WHERE g.mapping <> 'unmapped' AND g.gpu_uuid <> ''
                GROUP BY g.cluster, g.job_id_raw, g.submit_at, g.node, g.gpu_uuid
            ),
            best AS (
                SELECT DISTINCT ON (s.gpu_uuid) s.gpu_uuid, s.source, s.last_window_end_at, s.idle_since_at,
                       s.no_process_since_at, s.idle_util_max_percent, s.idle_memory_used_max_bytes
                FROM action_gpu_streak s
                WHERE s.gpu_uuid IN (SELECT gpu_uuid FROM gpus)
                ORDER BY s.gpu_uuid, (s.last_window_end_at > CAST(:fresh AS timestamptz)) DESC,
                         (s.source = 'agent') DESC, s.last_window_end_at DESC
            ),
            indices AS (
                SELECT DISTINCT ON (i.node, i.gpu_uuid) i.node, i.gpu_uuid, i.gpu_index
                FROM gpu_inventory i
                WHERE i.gpu_uuid IN (SELECT gpu_uuid FROM gpus)
                ORDER BY i.node, i.gpu_uuid, i.last_seen_at DESC
            )
            SELECT gp.cluster, gp.job_id_raw, gp.submit_at, gp.node, gp.gpu_uuid, gp.mapping, inv.gpu_index,
                   st.source, st.last_window_end_at, st.idle_since_at, st.no_process_since_at,
                   st.idle_util_max_percent, st.idle_memory_used_max_bytes
            FROM gpus gp
            LEFT JOIN best st ON st.gpu_uuid = gp.gpu_uuid
            LEFT JOIN indices inv ON inv.node = gp.node AND inv.gpu_uuid = gp.gpu_uuid
            ORDER BY gp.cluster, gp.job_id_raw, gp.submit_at, gp.node, inv.gpu_index, gp.gpu_uuid
            """
        ),
        params,
    ).all()
    conn.execute(text("RESET enable_nestloop"))
    for r in rows:
        attempt = attempts.get((r[0], int(r[1]), r[2]))
        if attempt is None:
            continue
        attempt.gpus.append(
            RunningGpu(
                node=r[3],
                gpu_uuid=r[4],
                gpu_index=None if r[6] is None else int(r[6]),
                mapping=r[5],
                source=r[7],
                last_window_end_at=r[8],
                idle_since_at=r[9],
                no_process_since_at=r[10],
                idle_util_max_percent=_float(r[11]),
                idle_memory_used_max_bytes=_int(r[12]),
            )
        )
    return list(attempts.values())


# the running attempts with GPUs (a CTE both queries of running_gpus start from)
_RUNNING = """
    WITH running AS MATERIALIZED (
        SELECT a.cluster, a.job_id_raw, a.submit_at, a.job_id, a.name, a.user_name, a.account,
               a.partition, a.qos, a.state, a.start_at, a.time_limit_seconds, a.alloc_gpus,
               a.gpu_model, a.submit_line, a.nodes,
               coalesce((a.alloc_tres->>'billing')::bigint, 0) AS billing
        FROM job_attempt a
        WHERE a.end_at IS NULL AND a.start_at IS NOT NULL AND a.start_at <= CAST(:now AS timestamptz)
          AND a.alloc_gpus > 0 AND a.state = ANY(CAST(:running AS text[]))
    )
"""


def gpu_stretches_now(
    conn: Connection, gpu_uuids: Sequence[str], *, start: datetime, end: datetime, idle_memory_max_bytes: int
) -> dict[str, dict[str, Any]]:
    """The re-check before a cancel, from the windows themselves (not the folded stretches):
    per GPU of GPU_UUIDS, over its windows overlapping [START, END) (the agent's where it has
    them), the newest window's end, the start of the trailing run of idle windows and of windows
    with no process, and the highest utilisation and memory in the idle run."""
    rows = conn.execute(
        text(
            """
            WITH w AS (
                SELECT DISTINCT ON (s.gpu_uuid, s.window_start_at)
                       s.gpu_uuid, s.window_start_at AS t0, s.window_seconds,
                       s.window_start_at + make_interval(secs => s.window_seconds) AS t1,
                       s.covered_seconds > 0
                           AND s.idle_seconds >= s.covered_seconds - 0.001 * s.window_seconds
                           AND coalesce(s.memory_used_max_bytes, 0) <= :mem AS idle,
                       s.covered_seconds > 0 AND s.no_process_seconds IS NOT NULL
                           AND s.no_process_seconds >= s.covered_seconds - 0.001 * s.window_seconds AS no_process,
                       s.util_max_percent, s.memory_used_max_bytes
                FROM slurmtel_gpu_windows(CAST(:uuids AS text[]), CAST(:start AS timestamptz), CAST(:end AS timestamptz)) s
                ORDER BY s.gpu_uuid, s.window_start_at, (s.source = 'agent') DESC
            ),
            marked AS (
                SELECT w.*, lag(t1) OVER (PARTITION BY gpu_uuid ORDER BY t0) AS prev_end FROM w
            ),
            resets AS (
                SELECT m.*,
                       CASE WHEN NOT idle THEN t1
                            WHEN prev_end IS NULL OR t0 - prev_end > make_interval(secs => 2 * window_seconds) THEN t0
                       END AS idle_reset,
                       CASE WHEN NOT no_process THEN t1
                            WHEN prev_end IS NULL OR t0 - prev_end > make_interval(secs => 2 * window_seconds) THEN t0
                       END AS process_reset
                FROM marked m
            ),
            per_gpu AS (
                SELECT gpu_uuid, max(t1) AS last_end, max(idle_reset) AS idle_since,
                       max(process_reset) AS no_process_since
                FROM resets GROUP BY gpu_uuid
            )
            SELECT p.gpu_uuid, p.last_end, least(p.idle_since, p.last_end) AS idle_since,
                   least(p.no_process_since, p.last_end) AS no_process_since,
                   max(r.util_max_percent) FILTER (WHERE r.t0 >= p.idle_since) AS util_max,
                   max(r.memory_used_max_bytes) FILTER (WHERE r.t0 >= p.idle_since) AS memory_max
            FROM per_gpu p JOIN resets r USING (gpu_uuid)
            GROUP BY p.gpu_uuid, p.last_end, p.idle_since, p.no_process_since
            """
        ),
        {"uuids": list(gpu_uuids), "start": start, "end": end, "mem": int(idle_memory_max_bytes)},
    ).mappings()
    return {
        r["gpu_uuid"]: {
            "last_window_end_at": r["last_end"],
            "idle_since_at": r["idle_since"],
            "no_process_since_at": r["no_process_since"],
            "idle_util_max_percent": _float(r["util_max"]),
            "idle_memory_used_max_bytes": _int(r["memory_max"]),
        }
        for r in rows
    }


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# ------------------------------------------------------------------ the record


@dataclass(frozen=True)
class NewAction:
    rule: str
    rule_kind: str
    subject: str
    step: str
    kind: str  # message | cancel | alert
    decided_at: datetime
    decided_by: str
    reason: str
    evidence: dict[str, Any]
    title: str = ""
    body_text: str = ""
    body_html: str = ""
    cluster: str = ""
    job_id_raw: int | None = None
    submit_at: datetime | None = None
    job_id: str = ""
    user: str = ""
    account: str = ""
    node: str = ""
    # (channel, target, recipient role) of each delivery
    deliveries: tuple[tuple[str, str, str], ...] = ()
    # the status of an action without deliveries ("skipped": nothing to send, the reason says why)
    status: str = "skipped"


def insert_action(conn: Connection, action: NewAction) -> int | None:
    """Record ACTION and its deliveries (pending, due now); None when (rule, subject, step) is
    already recorded (then nothing is written)."""
    action_id = conn.execute(
        text(
            """
            INSERT INTO action_log (rule, rule_kind, subject, step, kind, cluster, job_id_raw, submit_at,
                job_id, user_name, account, node, decided_at, decided_by, reason, evidence, title,
                body_text, body_html, status)
            VALUES (:rule, :rule_kind, :subject, :step, :kind, :cluster, :job_id_raw, :submit_at, :job_id,
                    :user, :account, :node, :decided_at, :decided_by, :reason, CAST(:evidence AS jsonb),
                    :title, :body_text, :body_html, :status)
            ON CONFLICT (rule, subject, step) DO NOTHING
            RETURNING id
            """
        ),
        {
            "rule": action.rule,
            "rule_kind": action.rule_kind,
            "subject": action.subject,
            "step": action.step,
            "kind": action.kind,
            "cluster": action.cluster,
            "job_id_raw": action.job_id_raw,
            "submit_at": action.submit_at,
            "job_id": action.job_id,
            "user": action.user,
            "account": action.account,
            "node": action.node,
            "decided_at": action.decided_at,
            "decided_by": action.decided_by,
            "reason": action.reason,
            "evidence": json.dumps(action.evidence, default=str, sort_keys=True),
            "title": action.title,
            "body_text": action.body_text,
            "body_html": action.body_html,
            "status": "pending" if action.deliveries else action.status,
        },
    ).scalar_one_or_none()
    if action_id is None:
        return None
    if action.deliveries:
        conn.execute(
            text(
                """
                INSERT INTO action_delivery (action_id, channel, target, recipient_role, state, next_try_at)
                SELECT :id, c, t, r, 'pending', :at
                FROM unnest(CAST(:channels AS text[]), CAST(:targets AS text[]), CAST(:roles AS text[])) AS d(c, t, r)
                ON CONFLICT DO NOTHING
                """
            ),
            {
                "id": action_id,
                "at": action.decided_at,
                "channels": [c for c, _, _ in action.deliveries],
                "targets": [t for _, t, _ in action.deliveries],
                "roles": [r for _, _, r in action.deliveries],
            },
        )
    return int(action_id)


@dataclass(frozen=True)
class TakenStep:
    step: str
    status: str
    decided_at: datetime
    # when every delivery of it was made (None: not all of them yet, or none)
    delivered_at: datetime | None
    # when the job's owner was told (None: not yet, or never)
    owner_delivered_at: datetime | None


def taken_steps(
    conn: Connection, rules: Sequence[str], subjects: Sequence[str]
) -> dict[tuple[str, str], dict[str, TakenStep]]:
    """(rule, subject) -> step -> what was recorded, for the RULES and SUBJECTS given."""
    if not rules or not subjects:
        return {}
    rows = conn.execute(
        text(
            """
            SELECT l.rule, l.subject, l.step, l.status, l.decided_at,
                   CASE WHEN count(d.id) > 0 AND bool_and(d.state = 'sent') THEN max(d.sent_at) END AS delivered_at,
                   max(d.sent_at) FILTER (WHERE d.recipient_role = 'owner' AND d.state = 'sent') AS owner_delivered_at
            FROM action_log l LEFT JOIN action_delivery d ON d.action_id = l.id
            WHERE l.rule = ANY(CAST(:rules AS text[])) AND l.subject = ANY(CAST(:subjects AS text[]))
            GROUP BY l.id
            """
        ),
        {"rules": list(rules), "subjects": list(subjects)},
    ).mappings()
    taken: dict[tuple[str, str], dict[str, TakenStep]] = {}
    for r in rows:
        taken.setdefault((r["rule"], r["subject"]), {})[r["step"]] = TakenStep(
            r["step"], r["status"], r["decided_at"], r["delivered_at"], r["owner_delivered_at"]
        )
    return taken


def recorded_subjects(conn: Connection, rule: str, subjects: Sequence[str]) -> set[tuple[str, str]]:
    """(subject, step) already recorded for RULE among SUBJECTS."""
    if not subjects:
        return set()
    rows = conn.execute(
        text(
            "SELECT subject, step FROM action_log WHERE rule = :rule AND subject = ANY(CAST(:subjects AS text[]))"
        ),
        {"rule": rule, "subjects": list(subjects)},
    )
    return {(r[0], r[1]) for r in rows}


# ------------------------------------------------------------------ deliveries


@dataclass(frozen=True)
class Delivery:
    id: int
    action_id: int
    channel: str
    target: str
    recipient_role: str
    state: str
    tries: int
    message_id: str
    # the action's
    rule: str
    rule_kind: str
    subject: str
    step: str
    kind: str
    cluster: str
    job_id_raw: int | None
    submit_at: datetime | None
    job_id: str
    user: str
    account: str
    node: str
    decided_at: datetime
    reason: str
    evidence: dict[str, Any]
    title: str
    body_text: str
    body_html: str


_DELIVERY_COLUMNS = """
    d.id, d.action_id, d.channel, d.target, d.recipient_role, d.state, d.tries, d.message_id,
    l.rule, l.rule_kind, l.subject, l.step, l.kind, l.cluster, l.job_id_raw, l.submit_at, l.job_id,
    l.user_name, l.account, l.node, l.decided_at, l.reason, l.evidence, l.title, l.body_text, l.body_html
"""


def _delivery(r: Any) -> Delivery:
    evidence = r["evidence"]
    return Delivery(
        id=int(r["id"]),
        action_id=int(r["action_id"]),
        channel=r["channel"],
        target=r["target"],
        recipient_role=r["recipient_role"],
        state=r["state"],
        tries=int(r["tries"]),
        message_id=r["message_id"],
        rule=r["rule"],
        rule_kind=r["rule_kind"],
        subject=r["subject"],
        step=r["step"],
        kind=r["kind"],
        cluster=r["cluster"],
        job_id_raw=None if r["job_id_raw"] is None else int(r["job_id_raw"]),
        submit_at=r["submit_at"],
        job_id=r["job_id"],
        user=r["user_name"],
        account=r["account"],
        node=r["node"],
        decided_at=r["decided_at"],
        reason=r["reason"],
        evidence=evidence if isinstance(evidence, dict) else json.loads(evidence or "{}"),
        title=r["title"],
        body_text=r["body_text"],
        body_html=r["body_html"],
    )


def due_deliveries(conn: Connection, *, now: datetime, limit: int = 1000) -> list[Delivery]:
    """Pending deliveries whose time has come, oldest first; a cancel's e-mail only once its
    scancel is done (it says the job was cancelled)."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_DELIVERY_COLUMNS}
            FROM action_delivery d JOIN action_log l ON l.id = d.action_id
            WHERE d.state = 'pending' AND d.next_try_at <= CAST(:now AS timestamptz)
              AND (d.channel = 'scancel' OR NOT EXISTS (
                  SELECT 1 FROM action_delivery c
                  WHERE c.action_id = d.action_id AND c.channel = 'scancel' AND c.state <> 'sent'))
            ORDER BY (d.channel = 'scancel') DESC, d.next_try_at, d.id
            LIMIT :limit
            """
        ),
        {"now": now, "limit": limit},
    ).mappings()
    return [_delivery(r) for r in rows]


def action_deliveries(conn: Connection, action_id: int) -> list[Delivery]:
    rows = conn.execute(
        text(
            f"""
            SELECT {_DELIVERY_COLUMNS}
            FROM action_delivery d JOIN action_log l ON l.id = d.action_id
            WHERE d.action_id = :id ORDER BY d.id
            """
        ),
        {"id": action_id},
    ).mappings()
    return [_delivery(r) for r in rows]


def orphaned_deliveries(conn: Connection) -> list[Delivery]:
    """Deliveries a process left in `sending` or `committing` (it died): only the lease holder
    asks, so no live process holds them."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_DELIVERY_COLUMNS}
            FROM action_delivery d JOIN action_log l ON l.id = d.action_id
            WHERE d.state IN ('sending', 'committing')
            ORDER BY d.id
            """
        )
    ).mappings()
    return [_delivery(r) for r in rows]


def claim_delivery(
    conn: Connection, delivery_id: int, *, holder: str, message_id: str, now: datetime
) -> bool:
    """pending -> sending, once: False when another process took it first (or it is not due)."""
    result = conn.execute(
        text(
            """
            UPDATE action_delivery SET state = 'sending', claimed_by = :holder, tries = tries + 1,
                   message_id = :message_id
            WHERE id = :id AND state = 'pending' AND next_try_at <= CAST(:now AS timestamptz)
            """
        ),
        {"id": delivery_id, "holder": holder, "message_id": message_id, "now": now},
    )
    return bool(result.rowcount)


def set_delivery_state(
    conn: Connection,
    delivery_id: int,
    *,
    from_states: Sequence[str],
    state: str,
    result: str | None = None,
    error: str | None = None,
    sent_at: datetime | None = None,
    next_try_at: datetime | None = None,
) -> bool:
    """Move a delivery from one of FROM_STATES to STATE (compare-and-set); False when it was in none."""
    done = conn.execute(
        text(
            """
            UPDATE action_delivery
            SET state = :state,
                result = coalesce(:result, result),
                last_error = coalesce(:error, last_error),
                sent_at = coalesce(CAST(:sent_at AS timestamptz), sent_at),
                next_try_at = coalesce(CAST(:next_try_at AS timestamptz), next_try_at),
                claimed_by = CASE WHEN :state IN ('sending', 'committing') THEN claimed_by ELSE '' END
            WHERE id = :id AND state = ANY(CAST(:from_states AS text[]))
            """
        ),
        {
            "id": delivery_id,
            "state": state,
            "from_states": list(from_states),
            "result": result,
            "error": error,
            "sent_at": sent_at,
            "next_try_at": next_try_at,
        },
    )
    return bool(done.rowcount)


def refresh_action_status(conn: Connection, action_id: int) -> None:
    """An action's status from its deliveries: pending while any is under way; else failed,
    uncertain or not_done when one is; else sent (a cancel: done)."""
    conn.execute(
        text(
            """
            UPDATE action_log l SET status = s.status, updated_at = now()
            FROM (
                SELECT CASE
                    WHEN bool_or(state IN ('pending', 'sending', 'committing')) THEN 'pending'
                    WHEN bool_or(state = 'failed') THEN 'failed'
                    WHEN bool_or(state = 'not_done') THEN 'not_done'
                    WHEN bool_or(state = 'uncertain') THEN 'uncertain'
                    ELSE 'sent' END AS status
                FROM action_delivery WHERE action_id = :id
            ) s
            WHERE l.id = :id AND s.status IS NOT NULL
            """
        ),
        {"id": action_id},
    )
    conn.execute(
        text("UPDATE action_log SET status = 'done' WHERE id = :id AND kind = 'cancel' AND status = 'sent'"),
        {"id": action_id},
    )


def pending_delivery_count(conn: Connection) -> dict[str, int]:
    rows = conn.execute(
        text(
            "SELECT state, count(*) FROM action_delivery WHERE state IN ('pending', 'failed', 'uncertain') GROUP BY state"
        )
    )
    return {r[0]: int(r[1]) for r in rows}


# ------------------------------------------------------------------ exclusions


@dataclass(frozen=True)
class Exclusion:
    id: int
    user: str
    starts_at: datetime
    ends_at: datetime
    reason: str
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    revoked_by: str


def add_exclusion(
    conn: Connection,
    *,
    user: str,
    starts_at: datetime,
    ends_at: datetime,
    reason: str,
    created_by: str,
    now: datetime,
) -> int:
    return int(
        conn.execute(
            text(
                """
                INSERT INTO action_exclusion (user_name, starts_at, ends_at, reason, created_by, created_at)
                VALUES (:user, :starts_at, :ends_at, :reason, :created_by, :now) RETURNING id
                """
            ),
            {
                "user": user,
                "starts_at": starts_at,
                "ends_at": ends_at,
                "reason": reason,
                "created_by": created_by,
                "now": now,
            },
        ).scalar_one()
    )


def revoke_exclusions(conn: Connection, *, user: str, revoked_by: str, now: datetime) -> int:
    """End USER's exclusions that are not over: they stay in the record, revoked."""
    result = conn.execute(
        text(
            """
            UPDATE action_exclusion SET revoked_at = :now, revoked_by = :by
            WHERE user_name = :user AND revoked_at IS NULL AND ends_at > :now
            """
        ),
        {"user": user, "by": revoked_by, "now": now},
    )
    return int(result.rowcount or 0)


def exclusions(conn: Connection, *, now: datetime | None = None) -> list[Exclusion]:
    """Every exclusion (NOW: only those in force then), newest first."""
    rows = conn.execute(
        text(
            """
            SELECT * FROM action_exclusion
            WHERE CAST(:now AS timestamptz) IS NULL
               OR (revoked_at IS NULL AND starts_at <= CAST(:now AS timestamptz) AND ends_at > CAST(:now AS timestamptz))
            ORDER BY created_at DESC, id DESC
            """
        ),
        {"now": now},
    ).mappings()
    return [
        Exclusion(
            id=int(r["id"]),
            user=r["user_name"],
            starts_at=r["starts_at"],
            ends_at=r["ends_at"],
            reason=r["reason"],
            created_by=r["created_by"],
            created_at=r["created_at"],
            revoked_at=r["revoked_at"],
            revoked_by=r["revoked_by"],
        )
        for r in rows
    ]


# ------------------------------------------------------------------ MailProg requests


def add_mail_request(
    conn: Connection,
    *,
    cluster: str,
    job_id: str,
    job_id_raw: int | None,
    recipient: str,
    mail_type: str,
    mail_subject: str,
    now: datetime,
) -> bool:
    """Record one job-end mail Slurm asked for; False when it is already recorded."""
    result = conn.execute(
        text(
            """
            INSERT INTO action_mail_request (cluster, job_id, job_id_raw, recipient, mail_type, mail_subject, received_at)
            VALUES (:cluster, :job_id, :job_id_raw, :recipient, :mail_type, :mail_subject, :now)
            ON CONFLICT DO NOTHING
            """
        ),
        {
            "cluster": cluster,
            "job_id": job_id,
            "job_id_raw": job_id_raw,
            "recipient": recipient,
            "mail_type": mail_type,
            "mail_subject": mail_subject,
            "now": now,
        },
    )
    return bool(result.rowcount)


@dataclass(frozen=True)
class EndedJob:
    """An ended attempt a job-end summary may be about, and the mail request that asked for it
    (request_id None: the rule does not wait for one)."""

    request_id: int | None
    recipient: str
    mail_type: str
    mail_subject: str
    received_at: datetime | None
    cluster: str
    job_id: str
    job_id_raw: int | None
    submit_at: datetime | None
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    start_at: datetime | None
    end_at: datetime | None
    time_limit_seconds: int | None
    alloc_gpus: int
    submit_line: str
    # the end attribution has computed the attempt to (None: not yet)
    computed_to: datetime | None


_ENDED_COLUMNS = """
    a.job_id_raw AS a_job_id_raw, a.submit_at, a.name, a.user_name, a.account, a.partition, a.qos, a.state,
    a.start_at, a.end_at, a.time_limit_seconds, a.alloc_gpus, a.submit_line, p.computed_to
"""


def _ended(r: Any, request: bool) -> EndedJob:
    return EndedJob(
        request_id=int(r["request_id"]) if request else None,
        recipient=r["recipient"] if request else "",
        mail_type=r["mail_type"] if request else "",
        mail_subject=r["mail_subject"] if request else "",
        received_at=r["received_at"] if request else None,
        cluster=r["cluster"],
        job_id=r["job_id"],
        job_id_raw=None if r["a_job_id_raw"] is None else int(r["a_job_id_raw"]),
        submit_at=r["submit_at"],
        name=r["name"] or "",
        user=r["user_name"] or "",
        account=r["account"] or "",
        partition=r["partition"] or "",
        qos=r["qos"] or "",
        state=r["state"] or "",
        start_at=r["start_at"],
        end_at=r["end_at"],
        time_limit_seconds=r["time_limit_seconds"],
        alloc_gpus=int(r["alloc_gpus"] or 0),
        submit_line=r["submit_line"] or "",
        computed_to=r["computed_to"],
    )


def open_mail_requests(conn: Connection) -> list[EndedJob]:
    """The job-end mails not handled yet, each with the newest attempt of its job (None fields
    while sacct has not stored it)."""
    rows = conn.execute(
        text(
            f"""
            SELECT r.id AS request_id, r.recipient, r.mail_type, r.mail_subject, r.received_at, r.cluster,
                   r.job_id, {_ENDED_COLUMNS}
            FROM action_mail_request r
            LEFT JOIN LATERAL (
                SELECT * FROM job_attempt a
                WHERE a.cluster = r.cluster
                  AND (a.job_id = r.job_id OR a.job_id_raw = r.job_id_raw)
                ORDER BY a.submit_at DESC LIMIT 1
            ) a ON true
            LEFT JOIN attribution_progress p
              ON p.cluster = a.cluster AND p.job_id_raw = a.job_id_raw AND p.submit_at = a.submit_at
            WHERE r.handled_at IS NULL
            ORDER BY r.received_at, r.id
            """
        )
    ).mappings()
    return [_ended(r, True) for r in rows]


def recently_ended(conn: Connection, *, since: datetime, until: datetime) -> list[EndedJob]:
    """Attempts with GPUs that ended in [SINCE, UNTIL)."""
    rows = conn.execute(
        text(
            f"""
            SELECT a.cluster, a.job_id, {_ENDED_COLUMNS}
            FROM job_attempt a
            LEFT JOIN attribution_progress p USING (cluster, job_id_raw, submit_at)
            WHERE a.end_at >= :since AND a.end_at < :until AND a.alloc_gpus > 0 AND a.start_at IS NOT NULL
            ORDER BY a.end_at, a.cluster, a.job_id_raw
            """
        ),
        {"since": since, "until": until},
    ).mappings()
    return [_ended(r, False) for r in rows]


def mark_requests_handled(conn: Connection, request_ids: Sequence[int], *, now: datetime) -> None:
    if request_ids:
        conn.execute(
            text(
                "UPDATE action_mail_request SET handled_at = :now WHERE id = ANY(CAST(:ids AS bigint[])) AND handled_at IS NULL"
            ),
            {"now": now, "ids": list(request_ids)},
        )


# ------------------------------------------------------------------ closed statements


def statements_closed_since(conn: Connection, since: datetime) -> list[dict[str, Any]]:
    """Closed months (closed at or after SINCE): month, when, checksum, lines and currency."""
    rows = conn.execute(
        text(
            """
            SELECT month, closed_at, csv_sha256, currency, lines, month_start_at, month_end_at
            FROM chargeback_statement WHERE closed_at >= :since ORDER BY month
            """
        ),
        {"since": since},
    ).mappings()
    return [dict(r) for r in rows]


# ------------------------------------------------------------------ reading the record


ACTION_LOG_COLUMNS = (
    "id",
    "decided_at",
    "rule",
    "step",
    "kind",
    "status",
    "cluster",
    "job_id",
    "user",
    "account",
    "node",
    "subject",
    "reason",
    "title",
    "deliveries",
    "evidence",
)


def action_log(
    conn: Connection,
    *,
    scope: Scope,
    since: datetime | None = None,
    until: datetime | None = None,
    user: str | None = None,
    job_id: str | None = None,
    rule: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """The record, newest first, inside SCOPE: each decision with its deliveries (channel,
    target, state, tries, when sent, the result or last error)."""
    rows = conn.execute(
        text(
            """
            SELECT l.id, l.decided_at, l.rule, l.step, l.kind, l.status, l.cluster, l.job_id,
                   l.user_name, l.account, l.node, l.subject, l.reason, l.title, l.evidence,
                   l.decided_by,
                   coalesce((SELECT json_agg(json_build_object(
                                'channel', d.channel, 'target', d.target, 'role', d.recipient_role,
                                'state', d.state,
                                'tries', d.tries, 'sent_at', d.sent_at, 'result', d.result,
                                'error', d.last_error) ORDER BY d.id)
                             FROM action_delivery d WHERE d.action_id = l.id), '[]') AS deliveries
            FROM action_log l
            WHERE slurmtel_in_scope(l.user_name, l.account, :scope_all, :scope_users, :scope_accounts)
              AND (CAST(:since AS timestamptz) IS NULL OR l.decided_at >= CAST(:since AS timestamptz))
              AND (CAST(:until AS timestamptz) IS NULL OR l.decided_at < CAST(:until AS timestamptz))
              AND (CAST(:user AS text) IS NULL OR l.user_name = CAST(:user AS text))
              AND (CAST(:job_id AS text) IS NULL OR l.job_id = CAST(:job_id AS text))
              AND (CAST(:rule AS text) IS NULL OR l.rule = CAST(:rule AS text))
            ORDER BY l.decided_at DESC, l.id DESC
            LIMIT :limit
            """
        ),
        {
            "since": since,
            "until": until,
            "user": user,
            "job_id": job_id,
            "rule": rule,
            "limit": limit,
            **scope.sql_params(),
        },
    ).mappings()
    result = []
    for r in rows:
        evidence = r["evidence"]
        deliveries = r["deliveries"]
        result.append(
            {
                "id": int(r["id"]),
                "decided_at": r["decided_at"],
                "decided_by": r["decided_by"],
                "rule": r["rule"],
                "step": r["step"],
                "kind": r["kind"],
                "status": r["status"],
                "cluster": r["cluster"],
                "job_id": r["job_id"],
                "user": r["user_name"],
                "account": r["account"],
                "node": r["node"],
                "subject": r["subject"],
                "reason": r["reason"],
                "title": r["title"],
                "evidence": evidence if isinstance(evidence, dict) else json.loads(evidence or "{}"),
                "deliveries": deliveries if isinstance(deliveries, list) else json.loads(deliveries or "[]"),
            }
        )
    return result


# ------------------------------------------------------------------ GPU events (node health)


def gpu_events_since(conn: Connection, since: datetime) -> list[tuple[str, str, int, datetime]]:
    """(node, kind, events, newest) of the GPU events (XID, ECC) at or after SINCE."""
    rows = conn.execute(
        text(
            "SELECT node, kind, count(*), max(at) FROM gpu_event WHERE at >= :since GROUP BY node, kind ORDER BY node, kind"
        ),
        {"since": since},
    )
    return [(r[0], r[1], int(r[2]), r[3]) for r in rows]


def newest_failures(conn: Connection, since: datetime) -> dict[str, datetime]:
    """node -> when the newest failed attempt (user_failure, system_failure) on it ended, of
    those that ended at or after SINCE."""
    rows = conn.execute(
        text(
            """
            SELECT n.node, max(a.end_at)
            FROM job_attempt_outcome a CROSS JOIN LATERAL unnest(a.nodes) AS n(node)
            WHERE a.end_at >= :since AND slurmtel_failed(a.outcome)
            GROUP BY n.node
            """
        ),
        {"since": since},
    )
    return {r[0]: r[1] for r in rows}
