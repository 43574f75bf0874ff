"""report rollups: attempt_node_day and node_day_allocation, kept by triggers

Revision ID: 0013
Revises: 0012

`report idle`, `report taxonomy` and `report capacity` read gpu_attribution, which has a row per
attempt x GPU x day (and per node-day an 'unmapped' row). None of them looks at single GPUs.

- attempt_node_day: gpu_attribution summed per (attempt, node, day), with the attempt's
  account, user, partition and state. Per attempt, so it serves every scope: idle sums it per
  attempt, capacity sums its retry attempts per node-day.
- node_day_allocation: attempt_node_day summed per (node-day, partition, state): the allocated
  parts taxonomy and capacity split each node-day into. It sums over every user's attempts, so
  only a scope of everything reads it (those two reports serve no other scope).

Values are the expressions the reports summed over gpu_attribution (each GPU row's seconds x
its gpu_fraction, float8, and taxonomy's per-row idle_with_process and active splits), summed
in float8 per key; a report sums them on. States, not outcome classes, so the configured
classes apply when a report reads them.

Kept by triggers, in the writing transaction, so the rollups are never behind what they sum:
- statement-level triggers on gpu_attribution (transition tables): whatever writes it (the
  attribution run recomputing its dirty attempts, a repair by hand, a cascade from job_attempt)
  has the attempt_node_day rows of the (attempt, node, day) keys it touched recomputed from
  gpu_attribution as it then is, then node_day_allocation of those node-days; a TRUNCATE
  empties both. Recomputing is idempotent.
- a row trigger on job_attempt, only when an attempt's account, user, partition or state
  changes (it ended, say): its attempt_node_day rows take the new values and node_day_allocation of their
  node-days is recomputed.
Reports are of whole site days (gpu_attribution is per site day), so the rollups serve every
window they take.

Row security as 0010 decides for such tables: attempt_node_day as gpu_attribution (the reader
sees a row with its attempt), node_day_allocation as the statements (a scope of everything
only); the writer every row. Privileges as 0010's default privileges give new tables (writer:
SELECT, INSERT, UPDATE, DELETE; reader: SELECT), granted here for a database whose default
privileges predate them.
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"

# slurmtel.store.jobs.REQUEUE_STATES when this was written (tests/test_report_rollups.py checks)
REQUEUE_STATES = ("REQUEUED", "NODE_FAIL", "PREEMPTED", "REQUEUE_FED", "REQUEUE_HOLD")

# the per-(attempt, node, day) sums, as SELECT expressions over gpu_attribution g
SUMS = {
    "allocated_seconds": "sum(g.allocated_seconds * g.gpu_fraction)",
    "covered_seconds": "sum(g.covered_seconds * g.gpu_fraction)",
    "busy_seconds": "sum(g.busy_seconds * g.gpu_fraction)",
    "idle_seconds": "sum(g.idle_seconds * g.gpu_fraction)",
    "no_process_seconds": "sum(g.no_process_seconds * g.gpu_fraction)",
    "unmeasured_seconds": "sum(g.unmeasured_seconds * g.gpu_fraction)",
    "util_weighted_sum": "sum(g.util_weighted_sum * g.gpu_fraction)",
    # idle time with a process on the GPU and active time, split per GPU row (report taxonomy)
    "idle_with_process_seconds": "sum(greatest(0, g.idle_seconds - g.no_process_seconds) * g.gpu_fraction)",
    "active_seconds": (
        "sum(greatest(0, g.covered_seconds - greatest(g.idle_seconds, g.no_process_seconds)) * g.gpu_fraction)"
    ),
    # allocation no GPU could be mapped to (whole GPUs, not x gpu_fraction: report idle)
    "unmapped_seconds": "coalesce(sum(g.allocated_seconds) FILTER (WHERE g.mapping = 'unmapped'), 0)",
}

_KEY = "cluster, job_id_raw, submit_at, node, day"
# the attempt's, copied: the reports' groups, scope and filter, and taxonomy's outcome
ATTEMPT_COLUMNS = ("account", "user_name", "partition", "state")
_ATTEMPT = ", ".join(ATTEMPT_COLUMNS)
_ATTEMPT_VALUES = ", ".join(f"min(a.{c})" for c in ATTEMPT_COLUMNS)

# node_day_allocation: the allocated parts report taxonomy splits, per node-day and the
# attempt's partition and state, summed over attempt_node_day
NODE_SUMS = ("no_process_seconds", "idle_with_process_seconds", "active_seconds", "unmeasured_seconds")
_NODE_KEY = "cluster, node, day, partition, state"


def _node_day_refresh_sql() -> str:
    """Recompute node_day_allocation for the node-days in the temp table node_day_key."""
    sums = ", ".join(f"sum(r.{c})" for c in NODE_SUMS)
    return f"""
            DELETE FROM node_day_allocation n USING node_day_key k
            WHERE n.cluster = k.cluster AND n.node = k.node AND n.day = k.day;
            INSERT INTO node_day_allocation ({_NODE_KEY}, {", ".join(NODE_SUMS)})
            SELECT r.cluster, r.node, r.day, r.partition, r.state, {sums}
            FROM attempt_node_day r JOIN node_day_key k
              ON r.cluster = k.cluster AND r.node = k.node AND r.day = k.day
            GROUP BY r.cluster, r.node, r.day, r.partition, r.state;"""


_TEMP_TABLES = """
            CREATE TEMP TABLE IF NOT EXISTS attempt_node_day_key (
                cluster text, job_id_raw bigint, submit_at timestamptz, node text, day date
            ) ON COMMIT DELETE ROWS;
            CREATE TEMP TABLE IF NOT EXISTS node_day_key (cluster text, node text, day date)
                ON COMMIT DELETE ROWS;
            TRUNCATE attempt_node_day_key;
            TRUNCATE node_day_key;"""


def _refresh_sql(changed: str) -> str:
    """Recompute the attempt_node_day rows of the (attempt, node, day) keys that the transition
    table CHANGED holds, then node_day_allocation of their node-days."""
    columns = ", ".join(SUMS)
    sums = ", ".join(SUMS.values())
    return f"""
            {_TEMP_TABLES}
            INSERT INTO attempt_node_day_key SELECT DISTINCT {_KEY} FROM {changed};
            ANALYZE attempt_node_day_key;
            DELETE FROM attempt_node_day r USING attempt_node_day_key k
            WHERE r.cluster = k.cluster AND r.job_id_raw = k.job_id_raw AND r.submit_at = k.submit_at
              AND r.node = k.node AND r.day = k.day;
            INSERT INTO attempt_node_day ({_KEY}, {_ATTEMPT}, {columns})
            SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.day, {_ATTEMPT_VALUES}, {sums}
            FROM gpu_attribution g
            JOIN attempt_node_day_key k
              ON g.cluster = k.cluster AND g.job_id_raw = k.job_id_raw AND g.submit_at = k.submit_at
             AND g.node = k.node AND g.day = k.day
            JOIN job_attempt a
              ON a.cluster = g.cluster AND a.job_id_raw = g.job_id_raw AND a.submit_at = g.submit_at
            GROUP BY g.cluster, g.job_id_raw, g.submit_at, g.node, g.day;
            INSERT INTO node_day_key SELECT DISTINCT cluster, node, day FROM attempt_node_day_key;
            ANALYZE node_day_key;
            {_node_day_refresh_sql()}"""


def upgrade() -> None:
    value_columns = ",\n".join(f"            {c} double precision NOT NULL" for c in SUMS)
    op.execute(
        f"""
        CREATE TABLE attempt_node_day (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            node text NOT NULL,
            day date NOT NULL,
            -- the attempt's, kept equal to job_attempt's by the trigger on job_attempt below
            account text NOT NULL,
            user_name text NOT NULL,
            partition text NOT NULL,
            state text NOT NULL,
{value_columns},
            PRIMARY KEY ({_KEY}),
            FOREIGN KEY (cluster, job_id_raw, submit_at)
                REFERENCES job_attempt (cluster, job_id_raw, submit_at) ON DELETE CASCADE
        )
        """
    )
    op.execute("CREATE INDEX attempt_node_day_day ON attempt_node_day (day, node)")
    node_columns = ",\n".join(f"            {c} double precision NOT NULL" for c in NODE_SUMS)
    op.execute(
        f"""
        CREATE TABLE node_day_allocation (
            cluster text NOT NULL,
            node text NOT NULL,
            day date NOT NULL,
            partition text NOT NULL,
            state text NOT NULL,
{node_columns},
            PRIMARY KEY ({_NODE_KEY})
        )
        """
    )
    op.execute("CREATE INDEX node_day_allocation_day ON node_day_allocation (day)")
    op.execute(
        f"""
        CREATE FUNCTION slurmtel_attribution_rollups_refresh() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            IF TG_OP = 'TRUNCATE' THEN
                DELETE FROM attempt_node_day;
                DELETE FROM node_day_allocation;
            ELSIF TG_OP = 'INSERT' THEN
                {_refresh_sql("new_rows")}
            ELSIF TG_OP = 'DELETE' THEN
                {_refresh_sql("old_rows")}
            ELSE
                {_refresh_sql("(SELECT * FROM old_rows UNION ALL SELECT * FROM new_rows) AS changed")}
            END IF;
            RETURN NULL;
        END
        $body$
        """
    )
    for event, referencing in (
        ("INSERT", "REFERENCING NEW TABLE AS new_rows"),
        ("UPDATE", "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"),
        ("DELETE", "REFERENCING OLD TABLE AS old_rows"),
    ):
        op.execute(
            f"CREATE TRIGGER report_rollups_{event.lower()} AFTER {event} ON gpu_attribution "
            f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION slurmtel_attribution_rollups_refresh()"
        )
    op.execute(
        "CREATE TRIGGER report_rollups_truncate AFTER TRUNCATE ON gpu_attribution "
        "FOR EACH STATEMENT EXECUTE FUNCTION slurmtel_attribution_rollups_refresh()"
    )
    # an attempt whose account, user, partition or state changes (it ended, say) moves its
    # rollup rows with it
    op.execute(
        f"""
        CREATE FUNCTION slurmtel_attempt_rollups_move() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            {_TEMP_TABLES}
            WITH moved AS (
                UPDATE attempt_node_day
                SET account = NEW.account, user_name = NEW.user_name, partition = NEW.partition,
                    state = NEW.state
                WHERE cluster = NEW.cluster AND job_id_raw = NEW.job_id_raw AND submit_at = NEW.submit_at
                RETURNING cluster, node, day
            )
            INSERT INTO node_day_key SELECT DISTINCT cluster, node, day FROM moved;
            {_node_day_refresh_sql()}
            RETURN NULL;
        END
        $body$
        """
    )
    op.execute(
        f"CREATE TRIGGER report_rollups_move AFTER UPDATE OF {_ATTEMPT} ON job_attempt FOR EACH ROW "
        f"WHEN (({', '.join(f'OLD.{c}' for c in ATTEMPT_COLUMNS)}) "
        f"IS DISTINCT FROM ({', '.join(f'NEW.{c}' for c in ATTEMPT_COLUMNS)})) "
        "EXECUTE FUNCTION slurmtel_attempt_rollups_move()"
    )
    # `report retries` reads the attempts of jobs with several attempts (or that may have):
    # later attempts and attempts in a requeue state, a few of every attempt
    states = ", ".join(f"'{s}'" for s in REQUEUE_STATES)
    op.execute(
        "CREATE INDEX job_attempt_requeue_or_later ON job_attempt (cluster, job_id_raw) "
        f"WHERE attempt_number IS DISTINCT FROM 1 OR state IN ({states})"
    )
    # what gpu_attribution already holds
    op.execute(
        f"""
        INSERT INTO attempt_node_day ({_KEY}, {_ATTEMPT}, {", ".join(SUMS)})
        SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.day, {_ATTEMPT_VALUES},
               {", ".join(SUMS.values())}
        FROM gpu_attribution g
        JOIN job_attempt a ON a.cluster = g.cluster AND a.job_id_raw = g.job_id_raw AND a.submit_at = g.submit_at
        GROUP BY g.cluster, g.job_id_raw, g.submit_at, g.node, g.day
        """
    )
    op.execute(
        f"""
        INSERT INTO node_day_allocation ({_NODE_KEY}, {", ".join(NODE_SUMS)})
        SELECT {_NODE_KEY}, {", ".join(f"sum({c})" for c in NODE_SUMS)}
        FROM attempt_node_day GROUP BY {_NODE_KEY}
        """
    )

    for table in ("attempt_node_day", "node_day_allocation"):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {WRITER}")
        op.execute(f"GRANT SELECT ON {table} TO {READER}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY writer_all ON {table} TO {WRITER} USING (true) WITH CHECK (true)")
    scope_all = "coalesce(current_setting('slurmtel.scope_all', true), '') = 'on'"
    # as gpu_attribution (0010): the reader sees a row with its attempt
    visible = (
        f"({scope_all} OR EXISTS (SELECT 1 FROM job_attempt a WHERE a.cluster = attempt_node_day.cluster "
        "AND a.job_id_raw = attempt_node_day.job_id_raw AND a.submit_at = attempt_node_day.submit_at))"
    )
    op.execute(f"CREATE POLICY reader_scope ON attempt_node_day FOR SELECT TO {READER} USING ({visible})")
    # sums over every user's attempts: a scope of everything only
    op.execute(
        f"CREATE POLICY reader_scope ON node_day_allocation FOR SELECT TO {READER} USING ({scope_all})"
    )


def downgrade() -> None:
    op.execute("DROP INDEX job_attempt_requeue_or_later")
    op.execute("DROP TRIGGER report_rollups_move ON job_attempt")
    op.execute("DROP FUNCTION slurmtel_attempt_rollups_move()")
    for event in ("insert", "update", "delete", "truncate"):
        op.execute(f"DROP TRIGGER report_rollups_{event} ON gpu_attribution")
    op.execute("DROP FUNCTION slurmtel_attribution_rollups_refresh()")
    op.execute("DROP TABLE node_day_allocation")
    op.execute("DROP TABLE attempt_node_day")
