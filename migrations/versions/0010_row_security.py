"""row security: group roles, least-privilege grants, row-level security, aggregate views

Revision ID: 0010
Revises: 0009

Roles. Three NOLOGIN group roles, cluster-wide, created here when missing (the first upgrade
to 0010 needs CREATEROLE, or an admin creates them beforehand): `slurmtel_writer` (the
daemon), `slurmtel_reader` (the API), `slurmtel_aggregate` (Grafana). Every grant and policy
below names only them; `slurmtel db roles` makes the site's LOGIN roles members. The downgrade
leaves the group roles (other databases of the cluster may use them) but takes back everything
granted to them here.

Row-level security: ENABLE, not FORCE. The table owner (who runs the migrations, and the
single-role deployments that predate 0010) keeps seeing and writing every row, as before;
a superuser always does. `slurmtel_writer` gets a policy admitting every row for every
command; `slurmtel_reader` a SELECT policy admitting a row only when the transaction's scope
settings (slurmtel.store.rls.set_transaction_scope) admit it; every other role none (no rows).
The scope is slurmtel.access.Scope, as the database function slurmtel_in_scope (0011) reads it:

    slurmtel.scope_all = 'on'                       everything
    user_name = ANY(slurmtel.scope_users)           own rows (a text[] literal)
    account = ANY(slurmtel.scope_accounts)          coordinated accounts (a text[] literal;
                                                    sub-accounts are already in it)

No setting (a new session, or a transaction that set none) is no rows.

Per table (a job is (cluster, job_id_raw, submit_at)):
- job_attempt, pending_job, retry_link: the scope on their own user_name and account.
- gpu_attribution, gpu_allocation: per attempt, without user or account: everything, or the
  attempt is a visible row of job_attempt (the EXISTS runs under job_attempt's policy).
- quarantine (raw records as they came: users, job names, command lines), gpu_job_span (the
  attribution run's own index of jobs on GPUs), nccl_log, nccl_run, nccl_run_node,
  nccl_pickup (acceptance runs and users' StdOut paths: the fabric reports are cluster-wide,
  a scope short of everything gets none), chargeback_statement, chargeback_statement_voided,
  chargeback_audit (statements hold a line per user; only admins and finance see them):
  everything only.
- Readable by the reader without a scope: what belongs to no user — outcome_class, collect_run,
  source_cursor, ingest_batch, attribution_batch, attribution_watermark, retry_link_state,
  controller_snapshot, agent_cursor, gpu_inventory, gpu_event, node_state, node_topology,
  fabric_port_window, nvlink_window, alembic_version — and gpu_summary: per-GPU windows whose
  job_ids are bare numbers (no user, account or name), read by a user's own `slurmtel job`
  through the GPUs of their attempts; filtering every window against job_attempt would cost
  each telemetry read a join for little.
- job_attempt_outcome (a view): security_invoker (PostgreSQL 15+), so job_attempt's policy
  applies to whoever reads it. A view is otherwise read with its owner's rights, and the owner
  passes row security: on PostgreSQL 14 the reader is not granted it at all (closed, not open).
  A later migration that makes a view in public (or this one again) makes it
  WITH (security_invoker = true); tests/test_db_roles.py checks every view there.

Partitions of gpu_summary: creating one needs ownership of gpu_summary and CREATE on the
schema. Rather than hand the writer either, two SECURITY DEFINER functions (owned by the owner)
create and drop the daily partition of a day, and only they: the writer may EXECUTE them.

Aggregate views for Grafana: schema slurmtel_agg, views read with their owner's rights (so
over every row) that expose no user names, job ids or job names: per account, partition, node
and hour or day. `slurmtel_aggregate` may read that schema and nothing else.
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

WRITER, READER, AGGREGATE = "slurmtel_writer", "slurmtel_reader", "slurmtel_aggregate"
AGG = "slurmtel_agg"

# the scope settings (slurmtel.store.rls writes them; '' after a transaction that set them ended)
_ALL = "coalesce(current_setting('slurmtel.scope_all', true), '') = 'on'"
# ARRAY(SELECT ...): read once per query (an InitPlan), not parsed again for every row
_USERS = "ARRAY(SELECT unnest(CAST(coalesce(nullif(current_setting('slurmtel.scope_users', true), ''), '{}') AS text[])))"
_ACCOUNTS = "ARRAY(SELECT unnest(CAST(coalesce(nullif(current_setting('slurmtel.scope_accounts', true), ''), '{}') AS text[])))"
_OWN_ROWS = f"({_ALL} OR user_name = ANY ({_USERS}) OR account = ANY ({_ACCOUNTS}))"
_OF_VISIBLE_ATTEMPT = (
    f"({_ALL} OR EXISTS (SELECT 1 FROM job_attempt a WHERE a.cluster = {{t}}.cluster "
    "AND a.job_id_raw = {t}.job_id_raw AND a.submit_at = {t}.submit_at))"
)

# table -> the reader's USING clause
READER_POLICIES = {
    "job_attempt": _OWN_ROWS,
    "pending_job": _OWN_ROWS,
    "retry_link": _OWN_ROWS,
    "gpu_attribution": _OF_VISIBLE_ATTEMPT.format(t="gpu_attribution"),
    "gpu_allocation": _OF_VISIBLE_ATTEMPT.format(t="gpu_allocation"),
    "quarantine": _ALL,
    "gpu_job_span": _ALL,
    "nccl_log": _ALL,
    "nccl_run": _ALL,
    "nccl_run_node": _ALL,
    "nccl_pickup": _ALL,
    "chargeback_statement": _ALL,
    "chargeback_statement_voided": _ALL,
    "chargeback_audit": _ALL,
}

_PARTITION_FUNCTIONS = """
    -- the daily partition of gpu_summary for DAY (UTC), named as slurmtel.store.telemetry names it
    CREATE FUNCTION slurmtel_create_summary_partition(day date) RETURNS boolean
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
    -- drops only a partition of gpu_summary, never another table
    CREATE FUNCTION slurmtel_drop_summary_partition(day date) RETURNS boolean
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
    REVOKE ALL ON FUNCTION slurmtel_create_summary_partition(date) FROM PUBLIC;
    REVOKE ALL ON FUNCTION slurmtel_drop_summary_partition(date) FROM PUBLIC;
"""

# Grafana's views. Hours and days are UTC (date_bin from the epoch), as Grafana's $__timeGroup
# cuts them; months are cut in the session's time zone (ALTER ROLE ... SET timezone).
_AGGREGATE_VIEWS = {
    # attempts that ran and ended, per hour they ended
    "attempts_ended": """
        SELECT a.cluster, a.account, a.partition, coalesce(o.outcome, 'unknown') AS outcome,
               date_bin('1 hour', a.end_at, TIMESTAMPTZ '1970-01-01 00:00+00') AS hour,
               count(*) AS attempts,
               sum(a.alloc_gpus * extract(epoch FROM a.end_at - a.start_at)) AS gpu_seconds
        FROM job_attempt a LEFT JOIN outcome_class o ON o.state = a.state
        WHERE a.start_at IS NOT NULL AND a.end_at IS NOT NULL
        GROUP BY 1, 2, 3, 4, 5
    """,
    # the same per node; a multi-node attempt's GPU-seconds are split evenly over its nodes
    "node_attempts_ended": """
        SELECT a.cluster, n.node, coalesce(o.outcome, 'unknown') AS outcome,
               date_bin('1 hour', a.end_at, TIMESTAMPTZ '1970-01-01 00:00+00') AS hour,
               count(*) AS attempts,
               count(*) FILTER (WHERE a.state = 'NODE_FAIL') AS node_fail_attempts,
               sum(a.alloc_gpus * extract(epoch FROM a.end_at - a.start_at) / cardinality(a.nodes))
                   AS gpu_seconds
        FROM job_attempt a LEFT JOIN outcome_class o ON o.state = a.state
        CROSS JOIN LATERAL unnest(a.nodes) AS n(node)
        WHERE a.start_at IS NOT NULL AND a.end_at IS NOT NULL
        GROUP BY 1, 2, 3, 4
    """,
    "gpu_events_hourly": """
        SELECT node, kind, date_bin('1 hour', at, TIMESTAMPTZ '1970-01-01 00:00+00') AS hour,
               count(*) AS events
        FROM gpu_event
        GROUP BY 1, 2, 3
    """,
    # attributed GPU-seconds per node, day (the site's), account and partition, MIG slices as
    # their share; idle_with_process and active are split per row as `report taxonomy` does
    "gpu_days": """
        SELECT g.cluster, g.node, g.day, a.account, a.partition,
               sum(g.allocated_seconds * g.gpu_fraction) AS allocated_gpu_seconds,
               sum(g.covered_seconds * g.gpu_fraction) AS covered_gpu_seconds,
               sum(g.busy_seconds * g.gpu_fraction) AS busy_gpu_seconds,
               sum(g.idle_seconds * g.gpu_fraction) AS idle_gpu_seconds,
               sum(g.no_process_seconds * g.gpu_fraction) AS no_process_gpu_seconds,
               sum(greatest(0, g.idle_seconds - g.no_process_seconds) * g.gpu_fraction)
                   AS idle_with_process_gpu_seconds,
               sum(greatest(0, g.covered_seconds - greatest(g.idle_seconds, g.no_process_seconds))
                   * g.gpu_fraction) AS active_gpu_seconds,
               sum(g.unmeasured_seconds * g.gpu_fraction) AS unmeasured_gpu_seconds
        FROM gpu_attribution g JOIN job_attempt a USING (cluster, job_id_raw, submit_at)
        GROUP BY 1, 2, 3, 4, 5
    """,
    # queue wait (start - eligible) of the attempts that started each UTC day; percentiles do
    # not add up, so per partition and day as the dashboard shows them
    "queue_wait_daily": """
        SELECT partition, date_bin('1 day', start_at, TIMESTAMPTZ '1970-01-01 00:00+00') AS day_start,
               count(*) AS started,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM start_at - eligible_at))
                   AS p50_seconds,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM start_at - eligible_at))
                   AS p95_seconds,
               max(extract(epoch FROM start_at - eligible_at)) AS max_seconds
        FROM job_attempt
        WHERE eligible_at IS NOT NULL AND start_at >= eligible_at
        GROUP BY 1, 2
    """,
    # jobs pending in each cluster's latest controller snapshot
    "pending_now": """
        SELECT p.cluster, p.reason, p.partition,
               p.reason LIKE ANY (ARRAY['AssocGrp%', 'AssocMax%', 'QOSGrp%', 'QOSMax%']) AS quota,
               count(*) AS jobs,
               sum(p.gpus_requested) AS gpus_requested,
               max(extract(epoch FROM s.observed_at - coalesce(p.eligible_at, p.submit_at)))
                   AS oldest_wait_seconds
        FROM pending_job p JOIN controller_snapshot s USING (cluster)
        WHERE p.last_seen_at = s.observed_at
        GROUP BY 1, 2, 3
    """,
    # node states as stored (nodes belong to nobody); the free-text reason is left out
    "node_states": """
        SELECT cluster, node, states, gpus_total, gpus_allocated, partitions, gpu_model,
               first_seen_at, last_seen_at
        FROM node_state
    """,
    # allocated GPU-seconds per account and month (session time zone), split at month edges,
    # running attempts up to now
    "account_gpu_months": """
        SELECT a.cluster, a.account, m.month_start,
               sum(a.alloc_gpus * extract(epoch FROM
                   least(coalesce(a.end_at, now()), m.month_start + interval '1 month')
                   - greatest(a.start_at, m.month_start))) AS gpu_seconds
        FROM job_attempt a
        CROSS JOIN LATERAL generate_series(date_trunc('month', a.start_at), coalesce(a.end_at, now()),
                                           interval '1 month') AS m(month_start)
        WHERE a.alloc_gpus > 0 AND a.start_at IS NOT NULL AND coalesce(a.end_at, now()) > m.month_start
        GROUP BY 1, 2, 3
    """,
    # closed statements' lines per account (a statement has a line per user: summed away)
    "statement_accounts": """
        SELECT s.month, s.month_start_at, s.month_end_at, s.currency, l ->> 'kind' AS kind,
               l ->> 'cluster' AS cluster, l ->> 'account' AS account,
               sum(CAST(l ->> 'gpu_hours' AS numeric)) AS gpu_hours,
               sum(CAST(l ->> 'amount' AS numeric)) AS amount,
               sum(CAST(l ->> 'waived_amount' AS numeric)) AS waived_amount,
               sum(CAST(l ->> 'billable_amount' AS numeric)) AS billable_amount,
               sum(CAST(l ->> 'unpriced_gpu_hours' AS numeric)) AS unpriced_gpu_hours
        FROM chargeback_statement s CROSS JOIN LATERAL jsonb_array_elements(s.lines) AS l
        GROUP BY 1, 2, 3, 4, 5, 6, 7
    """,
    "statement_completed_jobs": """
        SELECT s.month, s.month_start_at, s.month_end_at, s.currency, c ->> 'account' AS account,
               CAST(c ->> 'completed_jobs' AS numeric) AS completed_jobs,
               CAST(c ->> 'cost_per_completed_job' AS numeric) AS cost_per_completed_job,
               CAST(c ->> 'billable_per_completed_job' AS numeric) AS billable_per_completed_job
        FROM chargeback_statement s CROSS JOIN LATERAL jsonb_array_elements(s.completed_jobs) AS c
    """,
    # the closed statements, their totals and the checksum of the CSV finance received
    "statements": """
        SELECT s.month, s.month_start_at, s.month_end_at, s.closed_at, s.closed_by, s.currency,
               CAST(s.totals ->> 'gpu_hours' AS numeric) AS gpu_hours,
               CAST(s.totals ->> 'amount' AS numeric) AS amount,
               CAST(s.totals ->> 'waived_amount' AS numeric) AS waived_amount,
               CAST(s.totals ->> 'billable_amount' AS numeric) AS billable_amount,
               CAST(s.totals ->> 'unpriced_gpu_hours' AS numeric) AS unpriced_gpu_hours,
               s.csv_sha256
        FROM chargeback_statement s
    """,
}


def _create_group_role(name: str) -> None:
    # roles are cluster-wide: another database (or a concurrent upgrade) may have made it
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{name}') THEN
                CREATE ROLE {name} NOLOGIN;
            END IF;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'cannot create role {name}: run the upgrade as a role with CREATEROLE, '
                    'or have an admin run: CREATE ROLE {name} NOLOGIN';
        END $$
        """
    )


def _server_version() -> int:
    return int(op.get_bind().exec_driver_sql("SHOW server_version_num").scalar_one())


def upgrade() -> None:
    for role in (WRITER, READER, AGGREGATE):
        _create_group_role(role)

    # writer: rows of every table (not the schema revision), identity sequences, partitions
    op.execute(f"GRANT USAGE ON SCHEMA public TO {WRITER}, {READER}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {WRITER}")
    op.execute(f"REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM {WRITER}")
    op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {WRITER}")
    op.execute(_PARTITION_FUNCTIONS)
    op.execute(f"GRANT EXECUTE ON FUNCTION slurmtel_create_summary_partition(date) TO {WRITER}")
    op.execute(f"GRANT EXECUTE ON FUNCTION slurmtel_drop_summary_partition(date) TO {WRITER}")
    # reader: SELECT only
    op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER}")
    # tables later migrations add get the same (they run as the same owner)
    op.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {WRITER}"
    )
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {WRITER}")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {READER}")

    if _server_version() >= 150000:
        op.execute("ALTER VIEW job_attempt_outcome SET (security_invoker = true)")
    else:
        op.execute(f"REVOKE ALL ON job_attempt_outcome FROM {READER}")

    for table, using in READER_POLICIES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY writer_all ON {table} TO {WRITER} USING (true) WITH CHECK (true)")
        op.execute(f"CREATE POLICY reader_scope ON {table} FOR SELECT TO {READER} USING ({using})")

    op.execute(f"CREATE SCHEMA {AGG}")
    for name, query in _AGGREGATE_VIEWS.items():
        op.execute(f"CREATE VIEW {AGG}.{name} AS {query}")
    op.execute(f"GRANT USAGE ON SCHEMA {AGG} TO {AGGREGATE}")
    op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {AGG} TO {AGGREGATE}")


def downgrade() -> None:
    op.execute(f"DROP SCHEMA {AGG} CASCADE")
    for table in READER_POLICIES:
        op.execute(f"DROP POLICY reader_scope ON {table}")
        op.execute(f"DROP POLICY writer_all ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    if _server_version() >= 150000:
        op.execute("ALTER VIEW job_attempt_outcome RESET (security_invoker)")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM {WRITER}, {READER}")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM {WRITER}")
    op.execute("DROP FUNCTION slurmtel_drop_summary_partition(date)")
    op.execute("DROP FUNCTION slurmtel_create_summary_partition(date)")
    # partitions the functions made got the default privileges: all tables, partitions too
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {WRITER}, {READER}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {WRITER}")
    op.execute(f"REVOKE USAGE ON SCHEMA public FROM {WRITER}, {READER}")
