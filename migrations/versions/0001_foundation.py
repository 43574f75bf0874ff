"""foundation: job attempts, outcome classes, quarantine, collect runs, cursors

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE job_attempt (
            cluster text NOT NULL,
            job_id_raw bigint NOT NULL,
            submit_at timestamptz NOT NULL,
            job_id text NOT NULL,
            name text NOT NULL DEFAULT '',
            user_name text NOT NULL DEFAULT '',
            uid integer,
            account text NOT NULL DEFAULT '',
            partition text NOT NULL DEFAULT '',
            qos text NOT NULL DEFAULT '',
            wckey text NOT NULL DEFAULT '',
            state text NOT NULL,
            state_reason text NOT NULL DEFAULT '',
            exit_code text NOT NULL DEFAULT '',
            eligible_at timestamptz,
            start_at timestamptz,
            end_at timestamptz,
            time_limit_seconds bigint,
            alloc_gpus integer NOT NULL DEFAULT 0,
            alloc_cpus integer NOT NULL DEFAULT 0,
            gpu_model text NOT NULL DEFAULT '',
            alloc_tres jsonb NOT NULL DEFAULT '{}',
            req_tres jsonb NOT NULL DEFAULT '{}',
            array_job_id bigint,
            array_task_id integer,
            het_job_id bigint,
            het_job_offset integer,
            db_index bigint,
            nodelist text NOT NULL DEFAULT '',
            nodes text[] NOT NULL DEFAULT '{}',
            work_dir text NOT NULL DEFAULT '',
            submit_line text NOT NULL DEFAULT '',
            -- the job an attempt belongs to is (cluster, job_id_raw, job_submit_at):
            -- the submit time of its first attempt; set by the store after each write
            job_submit_at timestamptz,
            attempt_number integer,
            first_seen_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (cluster, job_id_raw, submit_at),
            CONSTRAINT job_attempt_end_after_start CHECK (end_at IS NULL OR start_at IS NULL OR end_at >= start_at),
            CONSTRAINT job_attempt_gpus_nonnegative CHECK (alloc_gpus >= 0)
        )
        """
    )
    op.execute("CREATE INDEX job_attempt_updated_at ON job_attempt (updated_at)")
    op.execute("CREATE INDEX job_attempt_user ON job_attempt (user_name, start_at)")
    op.execute("CREATE INDEX job_attempt_account ON job_attempt (account, start_at)")
    op.execute("CREATE INDEX job_attempt_job ON job_attempt (cluster, job_id_raw, job_submit_at)")
    op.execute(
        """
        CREATE TABLE outcome_class (
            state text PRIMARY KEY,
            outcome text NOT NULL
        )
        """
    )
    # attempts with their outcome class; states the config does not list are 'unknown'
    op.execute(
        """
        CREATE VIEW job_attempt_outcome AS
        SELECT a.*, coalesce(o.outcome, 'unknown') AS outcome
        FROM job_attempt a LEFT JOIN outcome_class o ON o.state = a.state
        """
    )
    op.execute(
        """
        CREATE TABLE quarantine (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source text NOT NULL,
            origin text NOT NULL,
            record_key text NOT NULL,
            reason text NOT NULL,
            raw text NOT NULL,
            raw_sha256 text NOT NULL,
            first_seen_at timestamptz NOT NULL DEFAULT now(),
            last_seen_at timestamptz NOT NULL DEFAULT now(),
            seen_count integer NOT NULL DEFAULT 1,
            UNIQUE (source, reason, raw_sha256)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE collect_run (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            source text NOT NULL,
            mode text NOT NULL,
            started_at timestamptz NOT NULL,
            finished_at timestamptz,
            status text NOT NULL,
            error_kind text NOT NULL DEFAULT '',
            message text NOT NULL DEFAULT '',
            rows_read integer NOT NULL DEFAULT 0,
            rows_written integer NOT NULL DEFAULT 0,
            rows_quarantined integer NOT NULL DEFAULT 0,
            window_start_at timestamptz,
            window_end_at timestamptz
        )
        """
    )
    op.execute("CREATE INDEX collect_run_source ON collect_run (source, started_at DESC)")
    op.execute(
        """
        CREATE TABLE source_cursor (
            source text NOT NULL,
            scope text NOT NULL,
            cursor_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (source, scope)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE source_cursor")
    op.execute("DROP TABLE collect_run")
    op.execute("DROP TABLE quarantine")
    op.execute("DROP VIEW job_attempt_outcome")
    op.execute("DROP TABLE outcome_class")
    op.execute("DROP TABLE job_attempt")
