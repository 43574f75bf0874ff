"""Chargeback SQL: a month's usage per statement key, completed jobs, stored statements.

Usage comes from the same windowed-attempt query as `report usage` (slurmtel_windowed_attempts),
so a statement's GPU-hours equal the usage report's for the same month. Seconds stay SQL
`numeric` (psycopg returns Decimal): money is never computed from a float.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, text

from slurmtel.access import EVERYTHING, Scope
from slurmtel.filters import JobFilter
from slurmtel.rows import ClosedStatement, LegacyUsageFigure, UsageFigure, line_from_data, line_to_data


def usage_figures(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    scope: Scope,
    tres: Sequence[str] = ("gres/gpu",),
) -> list[UsageFigure]:
    """Per (cluster, account, user, partition, GPU model, TRES of TRES): Slurm's count of the
    TRES x the exact seconds in [START, END) (AllocTRES; running attempts up to NOW), and
    that of system_failure attempts. For energy (joules the attempt consumed, not a count):
    its joules x the share of its run time inside [START, END).

    gres/gpu is the attempt's allocated GPUs (the GPU-seconds of `report usage`), except
    beside billing: with Slurm's billing TRES priced, GPU-seconds are counted only for attempts
    without a billing TRES (their usage is listed, unpriced). Keys whose TRES-seconds are 0 are
    left out."""
    sql = """
        WITH w AS (SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)),
        x AS (
            SELECT w.cluster, w.account, w.user_name, w.partition,
                   slurmtel_gpu_model(w.alloc_gpus, w.gpu_model) AS model, w.outcome, t.tres,
                   CASE WHEN t.tres = 'gres/gpu' THEN
                            CASE WHEN 'billing' = ANY(CAST(:tres AS text[]))
                                      AND coalesce(CAST(w.alloc_tres ->> 'billing' AS numeric), 0) > 0
                                 THEN 0 ELSE w.gpu_seconds END
                        -- consumed joules of the whole attempt, the month's share by time
                        WHEN t.tres = 'energy' THEN
                            coalesce(CAST(w.alloc_tres ->> 'energy' AS numeric), 0)
                            * slurmtel_window_gpu_seconds(1, w.start_at, w.end_at, :start, :end, :now)
                            / coalesce(nullif(slurmtel_elapsed_seconds(w.start_at, w.end_at, :now), 0), 1)
                        ELSE coalesce(CAST(w.alloc_tres ->> t.tres AS numeric), 0)
                             * slurmtel_window_gpu_seconds(1, w.start_at, w.end_at, :start, :end, :now)
                   END AS tres_seconds
            FROM w CROSS JOIN unnest(CAST(:tres AS text[])) AS t(tres)
        )
        SELECT cluster, account, user_name, partition, model, tres,
               sum(tres_seconds) AS tres_seconds,
               coalesce(sum(tres_seconds) FILTER (WHERE outcome = 'system_failure'), 0) AS sf_seconds
        FROM x
        GROUP BY cluster, account, user_name, partition, model, tres
        HAVING sum(tres_seconds) > 0
    """
    params: dict[str, Any] = {"start": start, "end": end, "now": now, "tres": list(tres)}
    params.update(scope.sql_params())
    params.update(JobFilter().sql_params())
    return [
        UsageFigure(
            cluster=r.cluster,
            account=r.account,
            user=r.user_name,
            partition=r.partition,
            gpu_model=r.model,
            tres=r.tres,
            tres_seconds=Decimal(r.tres_seconds),
            system_failure_tres_seconds=Decimal(r.sf_seconds),
        )
        for r in conn.execute(text(sql), params)
    ]


def usage_figures_format_1(
    conn: Connection, *, start: datetime, end: datetime, now: datetime, scope: Scope, billing: bool
) -> list[LegacyUsageFigure]:
    """Statement format 1's usage (months closed before format 2 are re-priced with it): per
    (cluster, account, user, partition, GPU model), exact GPU- and billing-seconds in
    [START, END), and those of system_failure attempts. GPU attempts only unless BILLING."""
    sql = """
        WITH w AS (SELECT * FROM slurmtel_windowed_attempts(:start, :end, :now, :scope_all, :scope_users, :scope_accounts, :f_accounts, :f_users, :f_partitions, :f_clusters)),
        x AS (
            SELECT cluster, account, user_name, partition, slurmtel_gpu_model(alloc_gpus, gpu_model) AS model, outcome, gpu_seconds,
                   CASE WHEN start_at IS NULL THEN 0
                        ELSE coalesce(CAST(alloc_tres ->> 'billing' AS numeric), 0) * greatest(0, extract(epoch FROM
                            least(coalesce(end_at, CAST(:now AS timestamptz)), CAST(:end AS timestamptz))
                            - greatest(start_at, CAST(:start AS timestamptz))))
                   END AS billing_seconds
            FROM w
            WHERE alloc_gpus > 0 OR CAST(:billing AS boolean)
        )
        SELECT cluster, account, user_name, partition, model,
               sum(gpu_seconds) AS gpu_seconds,
               coalesce(sum(gpu_seconds) FILTER (WHERE outcome = 'system_failure'), 0) AS sf_gpu_seconds,
               sum(billing_seconds) AS billing_seconds,
               coalesce(sum(billing_seconds) FILTER (WHERE outcome = 'system_failure'), 0) AS sf_billing_seconds
        FROM x
        GROUP BY cluster, account, user_name, partition, model
        HAVING sum(gpu_seconds) > 0 OR sum(billing_seconds) > 0
    """
    params: dict[str, Any] = {"start": start, "end": end, "now": now, "billing": billing}
    params.update(scope.sql_params())
    params.update(JobFilter().sql_params())
    return [
        LegacyUsageFigure(
            cluster=r.cluster,
            account=r.account,
            user=r.user_name,
            partition=r.partition,
            gpu_model=r.model,
            gpu_seconds=Decimal(r.gpu_seconds),
            system_failure_gpu_seconds=Decimal(r.sf_gpu_seconds),
            billing_seconds=Decimal(r.billing_seconds),
            system_failure_billing_seconds=Decimal(r.sf_billing_seconds),
        )
        for r in conn.execute(text(sql), params)
    ]


# the columns completed jobs may be counted by
_COMPLETED_KEYS = ("cluster", "partition", "account")


def completed_jobs_by(
    conn: Connection,
    keys: tuple[str, ...],
    *,
    start: datetime,
    end: datetime,
    scope: Scope = EVERYTHING,
    billing: bool = False,
) -> dict[tuple[str, ...], int]:
    """KEYS -> jobs whose last attempt ended in [START, END) classed completed (GPU jobs only
    unless BILLING): for cost per completed job and `report cost`."""
    if not keys or not set(keys) <= set(_COMPLETED_KEYS):
        raise ValueError(f"completed jobs are counted by {_COMPLETED_KEYS}, not {keys}")
    columns = ", ".join(f"a.{k}" for k in keys)
    sql = f"""
        -- the last attempt of a requeued job is the one submitted last (few jobs are requeued:
        -- a hash join on them beats probing every completed attempt for a later one)
        WITH requeued AS (
            SELECT cluster, job_id_raw, job_submit_at, max(submit_at) AS last_submit_at
            FROM job_attempt WHERE attempt_number > 1
            GROUP BY cluster, job_id_raw, job_submit_at
        )
        -- one last attempt per job, so count(*) counts jobs
        SELECT {columns}, count(*) AS n
        FROM job_attempt_outcome a
        LEFT JOIN requeued r
          ON r.cluster = a.cluster AND r.job_id_raw = a.job_id_raw AND r.job_submit_at = a.job_submit_at
        WHERE a.outcome = 'completed'
          AND a.end_at >= CAST(:start AS timestamptz) AND a.end_at < CAST(:end AS timestamptz)
          AND (a.alloc_gpus > 0 OR CAST(:billing AS boolean))
          AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts)
          AND (r.last_submit_at IS NULL OR r.last_submit_at = a.submit_at)
        GROUP BY {columns}
    """
    params: dict[str, Any] = {"start": start, "end": end, "billing": billing}
    params.update(scope.sql_params())
    return {tuple(r[:-1]): int(r.n) for r in conn.execute(text(sql), params)}


def completed_jobs_by_account(
    conn: Connection, *, start: datetime, end: datetime, scope: Scope, billing: bool
) -> dict[str, int]:
    """Jobs whose last attempt ended in [START, END) classed completed, per account."""
    counts = completed_jobs_by(conn, ("account",), start=start, end=end, scope=scope, billing=billing)
    return {account: n for (account,), n in counts.items()}


def closed_months(conn: Connection) -> list[str]:
    return list(conn.execute(text("SELECT month FROM chargeback_statement ORDER BY month")).scalars())


def closed_settings(conn: Connection) -> dict[str, dict[str, Any]]:
    """month -> the settings its closed statement was computed with (not its bytes)."""
    rows = conn.execute(text("SELECT month, settings FROM chargeback_statement ORDER BY month"))
    return {r.month: r.settings for r in rows}


def voided_months(conn: Connection) -> set[str]:
    return set(conn.execute(text("SELECT DISTINCT month FROM chargeback_statement_voided")).scalars())


def get_statements(conn: Connection, months: Sequence[str]) -> dict[str, ClosedStatement]:
    rows = conn.execute(
        text(
            """
            SELECT month, closed_at, closed_by, csv, json, csv_sha256, json_sha256, lines, totals,
                   completed_jobs, settings, month_start_at, month_end_at, format_version, statement_number
            FROM chargeback_statement WHERE month = ANY(CAST(:months AS text[])) ORDER BY month
            """
        ),
        {"months": list(months)},
    )
    return {
        r.month: ClosedStatement(
            month=r.month,
            closed_at=r.closed_at,
            closed_by=r.closed_by,
            csv=bytes(r.csv),
            json=bytes(r.json),
            csv_sha256=r.csv_sha256,
            json_sha256=r.json_sha256,
            lines=tuple(line_from_data(d) for d in r.lines),
            totals=r.totals,
            completed_jobs=tuple(r.completed_jobs),
            settings=r.settings,
            month_start_at=r.month_start_at,
            month_end_at=r.month_end_at,
            format_version=r.format_version,
            statement_number=r.statement_number,
        )
        for r in rows
    }


def next_statement_number(conn: Connection) -> int:
    """The next statement number (a sequence: numbers of rolled-back closes are skipped)."""
    return int(conn.execute(text("SELECT nextval('chargeback_statement_number')")).scalar_one())


def insert_statement(conn: Connection, statement: ClosedStatement, *, start: datetime, end: datetime) -> None:
    conn.execute(
        text(
            """
            INSERT INTO chargeback_statement (month, month_start_at, month_end_at, closed_at, closed_by,
                currency, csv, json, csv_sha256, json_sha256, lines, totals, completed_jobs, settings,
                format_version, statement_number)
            VALUES (:month, :start, :end, :closed_at, :closed_by, :currency, :csv, :json, :csv_sha256,
                :json_sha256, CAST(:lines AS jsonb), CAST(:totals AS jsonb), CAST(:completed AS jsonb),
                CAST(:settings AS jsonb), :format_version, :statement_number)
            """
        ),
        {
            "month": statement.month,
            "start": start,
            "end": end,
            "closed_at": statement.closed_at,
            "closed_by": statement.closed_by,
            "currency": statement.settings.get("currency", ""),
            "csv": statement.csv,
            "json": statement.json,
            "csv_sha256": statement.csv_sha256,
            "json_sha256": statement.json_sha256,
            "lines": json.dumps([line_to_data(line) for line in statement.lines]),
            "totals": json.dumps(dict(statement.totals)),
            "completed": json.dumps([dict(c) for c in statement.completed_jobs]),
            "settings": json.dumps(dict(statement.settings)),
            "format_version": statement.format_version,
            "statement_number": statement.statement_number,
        },
    )


def move_to_voided(conn: Connection, month: str, *, voided_at: datetime, voided_by: str, reason: str) -> None:
    """Keep MONTH's statement among the voided ones, then free the month for a new close."""
    conn.execute(
        text(
            """
            INSERT INTO chargeback_statement_voided (month, month_start_at, month_end_at, closed_at,
                closed_by, currency, csv, json, csv_sha256, json_sha256, lines, totals, completed_jobs,
                settings, format_version, statement_number, voided_at, voided_by, reason)
            SELECT month, month_start_at, month_end_at, closed_at, closed_by, currency, csv, json,
                   csv_sha256, json_sha256, lines, totals, completed_jobs, settings, format_version,
                   statement_number, :voided_at, :voided_by, :reason
            FROM chargeback_statement WHERE month = :month
            """
        ),
        {"month": month, "voided_at": voided_at, "voided_by": voided_by, "reason": reason},
    )
    conn.execute(text("DELETE FROM chargeback_statement WHERE month = :month"), {"month": month})


def insert_audit(
    conn: Connection, *, at: datetime, actor: str, action: str, month: str, csv_sha256: str, reason: str = ""
) -> None:
    conn.execute(
        text(
            """
            INSERT INTO chargeback_audit (at, actor, action, month, csv_sha256, reason)
            VALUES (:at, :actor, :action, :month, :csv_sha256, :reason)
            """
        ),
        {
            "at": at,
            "actor": actor,
            "action": action,
            "month": month,
            "csv_sha256": csv_sha256,
            "reason": reason,
        },
    )


@dataclass(frozen=True)
class StatementListing:
    """One row of `chargeback --list`: a closed or voided statement."""

    statement_number: int | None
    month: str
    status: str  # closed | voided
    format_version: int
    closed_at: datetime
    closed_by: str
    billable_amount: Decimal
    currency: str
    csv_sha256: str
    json_sha256: str
    voided_at: datetime | None
    voided_by: str
    reason: str


def list_statements(conn: Connection) -> list[StatementListing]:
    """Every closed statement and every voided one, by month then closing time."""
    rows = conn.execute(
        text(
            """
            SELECT statement_number, month, 'closed' AS status, format_version, closed_at, closed_by,
                   csv_sha256, json_sha256, currency, totals, NULL::timestamptz AS voided_at,
                   '' AS voided_by, '' AS reason
            FROM chargeback_statement
            UNION ALL
            SELECT statement_number, month, 'voided', format_version, closed_at, closed_by, csv_sha256,
                   json_sha256, currency, totals, voided_at, voided_by, reason
            FROM chargeback_statement_voided
            ORDER BY month, closed_at
            """
        )
    )
    return [
        StatementListing(
            statement_number=r.statement_number,
            month=r.month,
            status=r.status,
            format_version=r.format_version,
            closed_at=r.closed_at,
            closed_by=r.closed_by,
            billable_amount=Decimal(str(r.totals.get("billable_amount") or "0")),
            currency=r.currency,
            csv_sha256=r.csv_sha256,
            json_sha256=r.json_sha256,
            voided_at=r.voided_at,
            voided_by=r.voided_by,
            reason=r.reason,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    actor: str
    action: str
    month: str
    csv_sha256: str
    reason: str


def audit_entries(conn: Connection) -> list[AuditEntry]:
    rows = conn.execute(
        text("SELECT at, actor, action, month, csv_sha256, reason FROM chargeback_audit ORDER BY id")
    )
    return [AuditEntry(r.at, r.actor, r.action, r.month, r.csv_sha256, r.reason) for r in rows]
