"""chargeback: voided statements and the audit trail of closing and voiding

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A voided statement keeps every byte and figure it had; its month may then be closed
    # again (chargeback_statement has one row per month). Never updated or deleted.
    op.execute(
        """
        CREATE TABLE chargeback_statement_voided (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            month text NOT NULL,
            month_start_at timestamptz NOT NULL,
            month_end_at timestamptz NOT NULL,
            closed_at timestamptz NOT NULL,
            closed_by text NOT NULL,
            currency text NOT NULL,
            csv bytea NOT NULL,
            json bytea NOT NULL,
            csv_sha256 text NOT NULL,
            json_sha256 text NOT NULL,
            lines jsonb NOT NULL,
            totals jsonb NOT NULL,
            completed_jobs jsonb NOT NULL,
            settings jsonb NOT NULL,
            voided_at timestamptz NOT NULL,
            voided_by text NOT NULL,
            reason text NOT NULL CHECK (reason <> '')
        )
        """
    )
    op.execute("CREATE INDEX chargeback_statement_voided_month ON chargeback_statement_voided (month)")
    # Who closed or voided which month, when and why: append-only.
    op.execute(
        """
        CREATE TABLE chargeback_audit (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            at timestamptz NOT NULL,
            actor text NOT NULL,
            action text NOT NULL CHECK (action IN ('close', 'void')),
            month text NOT NULL,
            csv_sha256 text NOT NULL,
            reason text NOT NULL DEFAULT ''
        )
        """
    )
    # statements closed before this revision: their closing is the first audit entry
    op.execute(
        """
        INSERT INTO chargeback_audit (at, actor, action, month, csv_sha256)
        SELECT closed_at, closed_by, 'close', month, csv_sha256 FROM chargeback_statement ORDER BY closed_at
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE chargeback_audit")
    op.execute("DROP TABLE chargeback_statement_voided")
