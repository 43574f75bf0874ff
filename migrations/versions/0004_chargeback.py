"""chargeback: closed monthly statements

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A closed month, frozen: the exact bytes exported (re-export returns them unchanged), their
    # checksums, and the figures as data (money as decimal strings) from which later
    # adjustments are computed and Grafana reads amounts. Written once, never updated.
    op.execute(
        """
        CREATE TABLE chargeback_statement (
            month text PRIMARY KEY CHECK (month ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
            -- the month's edges in the site's time zone when it was closed
            month_start_at timestamptz NOT NULL,
            month_end_at timestamptz NOT NULL,
            closed_at timestamptz NOT NULL,
            closed_by text NOT NULL DEFAULT '',
            currency text NOT NULL,
            csv bytea NOT NULL,
            json bytea NOT NULL,
            csv_sha256 text NOT NULL,
            json_sha256 text NOT NULL,
            -- statement lines (kind 'usage' for this month, 'adjustment' for earlier closed months)
            lines jsonb NOT NULL,
            totals jsonb NOT NULL,
            -- cost per completed job per account
            completed_jobs jsonb NOT NULL,
            -- rates, currency, rounding and waiver the statement was computed with
            settings jsonb NOT NULL,
            CHECK (month_end_at > month_start_at)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE chargeback_statement")
