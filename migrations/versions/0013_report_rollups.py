"""report rollups: gpu_attribution summed per attempt x node x day, kept by triggers

Revision ID: 0013
Revises: 0011 (while 0012 is written elsewhere; re-pointed at the merge)

`report idle`, `report taxonomy` and `report capacity` read gpu_attribution, which has a row per
attempt x GPU x day (and per node-day an 'unmapped' row). None of them looks at single GPUs:
idle sums per attempt, taxonomy and capacity per node-day and attempt. attempt_node_day holds
those sums once per (attempt, node, day), several times fewer rows than gpu_attribution, with
the same expressions the reports summed (each GPU's seconds x its gpu_fraction, float8, and
taxonomy's per-GPU idle_with_process and active splits), so a report that sums it gets the
sums it got from gpu_attribution.

Kept by statement-level triggers on gpu_attribution, in the writing transaction: whatever
writes gpu_attribution (the attribution run's recompute of its dirty attempts, a repair, a
cascade from job_attempt) has the (attempt, node, day) sums it touched recomputed from
gpu_attribution as it then is. Recomputing is idempotent; the table is never behind
gpu_attribution, so the reports read it in place of gpu_attribution for every window (they
are of whole site days, as gpu_attribution is).

Row security as gpu_attribution's (0010): per attempt, without user or account; the reader
sees a row only with its attempt (or with a scope of everything), the writer every row.
Privileges: the default privileges of 0010 (writer: SELECT, INSERT, UPDATE, DELETE; reader:
SELECT), granted again here for a database whose default privileges predate them.
"""

from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"

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


def _refresh_sql(changed: str) -> str:
    """Recompute the rows of the (attempt, node, day) keys that the transition table CHANGED holds."""
    columns = ", ".join(SUMS)
    sums = ", ".join(SUMS.values())
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in SUMS)
    return f"""
            CREATE TEMP TABLE IF NOT EXISTS attempt_node_day_key (
                cluster text, job_id_raw bigint, submit_at timestamptz, node text, day date
            ) ON COMMIT DELETE ROWS;
            TRUNCATE attempt_node_day_key;
            INSERT INTO attempt_node_day_key SELECT DISTINCT {_KEY} FROM {changed};
            ANALYZE attempt_node_day_key;
            DELETE FROM attempt_node_day r USING attempt_node_day_key k
            WHERE r.cluster = k.cluster AND r.job_id_raw = k.job_id_raw AND r.submit_at = k.submit_at
              AND r.node = k.node AND r.day = k.day;
            INSERT INTO attempt_node_day ({_KEY}, {columns})
            SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.day, {sums}
            FROM gpu_attribution g JOIN attempt_node_day_key k
              ON g.cluster = k.cluster AND g.job_id_raw = k.job_id_raw AND g.submit_at = k.submit_at
             AND g.node = k.node AND g.day = k.day
            GROUP BY g.cluster, g.job_id_raw, g.submit_at, g.node, g.day
            ON CONFLICT ({_KEY}) DO UPDATE SET {updates};"""


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
{value_columns},
            PRIMARY KEY ({_KEY}),
            FOREIGN KEY (cluster, job_id_raw, submit_at)
                REFERENCES job_attempt (cluster, job_id_raw, submit_at) ON DELETE CASCADE
        )
        """
    )
    op.execute("CREATE INDEX attempt_node_day_day ON attempt_node_day (day)")
    op.execute(
        f"""
        CREATE FUNCTION slurmtel_attempt_node_day_refresh() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            IF TG_OP = 'TRUNCATE' THEN
                DELETE FROM attempt_node_day;
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
            f"CREATE TRIGGER attempt_node_day_{event.lower()} AFTER {event} ON gpu_attribution "
            f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION slurmtel_attempt_node_day_refresh()"
        )
    op.execute(
        "CREATE TRIGGER attempt_node_day_truncate AFTER TRUNCATE ON gpu_attribution "
        "FOR EACH STATEMENT EXECUTE FUNCTION slurmtel_attempt_node_day_refresh()"
    )
    # what gpu_attribution already holds
    op.execute(
        f"""
        INSERT INTO attempt_node_day ({_KEY}, {", ".join(SUMS)})
        SELECT g.cluster, g.job_id_raw, g.submit_at, g.node, g.day, {", ".join(SUMS.values())}
        FROM gpu_attribution g
        GROUP BY g.cluster, g.job_id_raw, g.submit_at, g.node, g.day
        """
    )

    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON attempt_node_day TO {WRITER}")
    op.execute(f"GRANT SELECT ON attempt_node_day TO {READER}")
    # as gpu_attribution (0010): the reader sees a row with its attempt
    visible = (
        "(coalesce(current_setting('slurmtel.scope_all', true), '') = 'on' OR EXISTS (SELECT 1 FROM "
        "job_attempt a WHERE a.cluster = attempt_node_day.cluster AND a.job_id_raw = attempt_node_day.job_id_raw "
        "AND a.submit_at = attempt_node_day.submit_at))"
    )
    op.execute("ALTER TABLE attempt_node_day ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY writer_all ON attempt_node_day TO {WRITER} USING (true) WITH CHECK (true)")
    op.execute(f"CREATE POLICY reader_scope ON attempt_node_day FOR SELECT TO {READER} USING ({visible})")


def downgrade() -> None:
    for event in ("insert", "update", "delete", "truncate"):
        op.execute(f"DROP TRIGGER attempt_node_day_{event} ON gpu_attribution")
    op.execute("DROP FUNCTION slurmtel_attempt_node_day_refresh()")
    op.execute("DROP TABLE attempt_node_day")
