"""chargeback statement format 2: statement numbers, the format of each statement, forced closes

Revision ID: 0018
Revises: 0015

A statement closed from now on is format 2: lines only (totals in their own file), the TRES and
the billed unit of each line, and the statement's number, date and checksum on every row. A
statement closed before is format 1 and stays exactly as it was closed (its bytes are never
rewritten); `format_version` says which a row is.

Statement numbers: one sequence over every statement ever closed, voided ones included (a
re-closed month gets a new number). Statements closed before this revision are numbered here in
the order they were closed, so `chargeback --list` shows a number for each; their stored bytes,
being format 1, do not carry it.

The audit trail gains `forced_close`: a close that `--force` made past the guards (a month
without usage, or earlier than the latest closed one), its reason saying which.

Grafana's statement views read both formats: format 1 lines have gpu_hours, format 2 lines
allocated_tres_seconds of a TRES (gres/gpu's / 3600 are the GPU-hours).
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

AGG = "slurmtel_agg"

_GPU_HOURS = """CASE WHEN l ? 'gpu_hours' THEN CAST(l ->> 'gpu_hours' AS numeric)
                     WHEN l ->> 'tres' = 'gres/gpu' THEN CAST(l ->> 'allocated_tres_seconds' AS numeric) / 3600
                     ELSE 0 END"""
_UNPRICED_GPU_HOURS = """CASE WHEN l ? 'gpu_hours' THEN CAST(l ->> 'unpriced_gpu_hours' AS numeric)
                     WHEN l ->> 'tres' = 'gres/gpu' AND NOT CAST(l ->> 'priced' AS boolean)
                         THEN CAST(l ->> 'allocated_tres_seconds' AS numeric) / 3600
                     ELSE 0 END"""

STATEMENT_ACCOUNTS = f"""
    SELECT s.month, s.month_start_at, s.month_end_at, s.currency, l ->> 'kind' AS kind,
           l ->> 'cluster' AS cluster, l ->> 'account' AS account,
           sum({_GPU_HOURS}) AS gpu_hours,
           sum(CAST(l ->> 'amount' AS numeric)) AS amount,
           sum(CAST(l ->> 'waived_amount' AS numeric)) AS waived_amount,
           sum(CAST(l ->> 'billable_amount' AS numeric)) AS billable_amount,
           sum({_UNPRICED_GPU_HOURS}) AS unpriced_gpu_hours
    FROM chargeback_statement s CROSS JOIN LATERAL jsonb_array_elements(s.lines) AS l
    GROUP BY 1, 2, 3, 4, 5, 6, 7
"""

STATEMENTS = """
    SELECT s.month, s.month_start_at, s.month_end_at, s.closed_at, s.closed_by, s.currency,
           CASE WHEN s.format_version = 1 THEN CAST(s.totals ->> 'gpu_hours' AS numeric)
                ELSE (SELECT coalesce(sum(CAST(u ->> 'billed_quantity' AS numeric)), 0)
                      FROM jsonb_array_elements(s.totals -> 'by_unit') AS u
                      WHERE u ->> 'billed_unit' = 'gpu_hour') END AS gpu_hours,
           CAST(s.totals ->> 'amount' AS numeric) AS amount,
           CAST(s.totals ->> 'waived_amount' AS numeric) AS waived_amount,
           CAST(s.totals ->> 'billable_amount' AS numeric) AS billable_amount,
           CASE WHEN s.format_version = 1 THEN CAST(s.totals ->> 'unpriced_gpu_hours' AS numeric)
                ELSE (SELECT coalesce(sum(CAST(u ->> 'unpriced_quantity' AS numeric)), 0)
                      FROM jsonb_array_elements(s.totals -> 'by_unit') AS u
                      WHERE u ->> 'billed_unit' = 'gpu_hour') END AS unpriced_gpu_hours,
           s.csv_sha256, s.statement_number, s.format_version
    FROM chargeback_statement s
"""

# the views as 0010 made them (format 1 only), for the downgrade
_FORMAT_1_VIEWS = {
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


def upgrade() -> None:
    op.execute("CREATE SEQUENCE chargeback_statement_number AS bigint")
    for table in ("chargeback_statement", "chargeback_statement_voided"):
        op.execute(
            f"ALTER TABLE {table} ADD COLUMN format_version smallint NOT NULL DEFAULT 1, "
            "ADD COLUMN statement_number bigint"
        )
        # every later statement says its format
        op.execute(f"ALTER TABLE {table} ALTER COLUMN format_version DROP DEFAULT")
    # the statements closed so far, voided ones included, numbered in the order they were closed
    op.execute(
        """
        WITH every AS (
            SELECT 'closed' AS status, month, closed_at, NULL::bigint AS id FROM chargeback_statement
            UNION ALL
            SELECT 'voided', month, closed_at, id FROM chargeback_statement_voided
        ), numbered AS (
            SELECT status, month, closed_at, id,
                   row_number() OVER (ORDER BY closed_at, month, status, id) AS n
            FROM every
        ), closed AS (
            UPDATE chargeback_statement s SET statement_number = n
            FROM numbered WHERE numbered.status = 'closed' AND numbered.month = s.month
        )
        UPDATE chargeback_statement_voided v SET statement_number = n
        FROM numbered WHERE numbered.status = 'voided' AND numbered.id = v.id
        """
    )
    op.execute(
        "SELECT setval('chargeback_statement_number', coalesce((SELECT max(n) FROM ("
        "SELECT statement_number AS n FROM chargeback_statement UNION ALL "
        "SELECT statement_number FROM chargeback_statement_voided) x), 0) + 1, false)"
    )
    op.execute(
        "ALTER TABLE chargeback_statement ALTER COLUMN statement_number SET DEFAULT "
        "nextval('chargeback_statement_number'), ALTER COLUMN statement_number SET NOT NULL"
    )
    op.execute("ALTER SEQUENCE chargeback_statement_number OWNED BY chargeback_statement.statement_number")
    op.execute(
        "CREATE UNIQUE INDEX chargeback_statement_number_unique ON chargeback_statement (statement_number)"
    )
    op.execute("ALTER TABLE chargeback_audit DROP CONSTRAINT chargeback_audit_action_check")
    op.execute(
        "ALTER TABLE chargeback_audit ADD CONSTRAINT chargeback_audit_action_check "
        "CHECK (action IN ('close', 'void', 'forced_close'))"
    )
    op.execute(f"CREATE OR REPLACE VIEW {AGG}.statement_accounts AS {STATEMENT_ACCOUNTS}")
    op.execute(f"CREATE OR REPLACE VIEW {AGG}.statements AS {STATEMENTS}")


def downgrade() -> None:
    # format 2 statements cannot be read by the code of 0015: refuse rather than lose them
    op.execute(
        """
        DO $$ BEGIN
            IF EXISTS (SELECT 1 FROM chargeback_statement WHERE format_version > 1)
               OR EXISTS (SELECT 1 FROM chargeback_statement_voided WHERE format_version > 1)
               OR EXISTS (SELECT 1 FROM chargeback_audit WHERE action = 'forced_close') THEN
                RAISE EXCEPTION 'statements of format 2 are stored: downgrading below 0018 would '
                    'leave them unreadable';
            END IF;
        END $$
        """
    )
    op.execute(f"DROP VIEW {AGG}.statements")
    op.execute(f"DROP VIEW {AGG}.statement_accounts")
    for name, query in _FORMAT_1_VIEWS.items():
        op.execute(f"CREATE VIEW {AGG}.{name} AS {query}")
    op.execute(f"GRANT SELECT ON {AGG}.statement_accounts, {AGG}.statements TO slurmtel_aggregate")
    op.execute("ALTER TABLE chargeback_audit DROP CONSTRAINT chargeback_audit_action_check")
    op.execute(
        "ALTER TABLE chargeback_audit ADD CONSTRAINT chargeback_audit_action_check "
        "CHECK (action IN ('close', 'void'))"
    )
    op.execute("DROP INDEX chargeback_statement_number_unique")
    for table in ("chargeback_statement", "chargeback_statement_voided"):
        op.execute(f"ALTER TABLE {table} DROP COLUMN statement_number, DROP COLUMN format_version")
    op.execute("DROP SEQUENCE IF EXISTS chargeback_statement_number")
