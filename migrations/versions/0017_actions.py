"""actions: the record of every message and action, their deliveries, idle stretches per GPU,
exclusions, and job-end mail requests (DESIGN §11)

Revision ID: 0017
Revises: 0015

- action_log: one row per decision, unique on (rule, subject, step): the same rule never
  acts twice on the same job (node, account, month) at the same step, whoever decides and
  however often. Who (the job's user and account, the recipients in its deliveries, who
  decided), what (kind, step, the message as rendered), why (reason), when (decided_at), the
  evidence (JSON: which GPUs, how long, which figures) and the status.
- action_delivery: one row per channel and target of an action (an e-mail to its addresses, a
  webhook, a scancel), unique on (action_id, channel, target), with its own state machine:
  pending -> sending -> committing -> sent, or back to pending (a retry, next_try_at), failed
  (given up), not_done (a cancel whose re-check found the job no longer idle or running) or
  uncertain (the process died after the last byte left and before the answer was recorded:
  never sent again). slurmtel.actions.deliver explains the phases.
- action_gpu_streak: per GPU and source, the current stretch of idle windows and of windows
  with no process, folded in from each new telemetry batch (action_batch marks the batches
  folded in, as attribution_batch does for attribution).
- action_exclusion: users an admin put on the exclusion list for a period, with who and why
  (revoking one keeps the row).
- action_mail_request: the job-end mails Slurm asked `slurmtel mailprog` (MailProg) to send.

Row security: action_log by its own user and account (a user sees the actions on their own
jobs, a coordinator their accounts', admins all; node alerts have no user: admins only);
action_delivery with its action; the rest everything only (action_batch, like
attribution_batch, holds nothing of a user).
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

WRITER, READER = "slurmtel_writer", "slurmtel_reader"

# the scope the API proves (migration 0016): the reader role's unproven settings grant nothing
_ALL = "(SELECT p.scope_all FROM slurmtel_proven_scope(slurmtel_scope_session()) p)"
_USERS = "CAST((SELECT p.scope_users FROM slurmtel_proven_scope(slurmtel_scope_session()) p) AS text[])"
_ACCOUNTS = "CAST((SELECT p.scope_accounts FROM slurmtel_proven_scope(slurmtel_scope_session()) p) AS text[])"
_OWN_ROWS = f"({_ALL} OR user_name = ANY ({_USERS}) OR account = ANY ({_ACCOUNTS}))"
_OF_VISIBLE_ACTION = f"({_ALL} OR EXISTS (SELECT 1 FROM action_log a WHERE a.id = action_delivery.action_id))"

READER_POLICIES = {
    "action_log": _OWN_ROWS,
    "action_delivery": _OF_VISIBLE_ACTION,
    "action_gpu_streak": _ALL,
    "action_exclusion": _ALL,
    "action_mail_request": _ALL,
}


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE action_log (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            rule text NOT NULL,
            rule_kind text NOT NULL,
            -- what the rule acted on: "job:<cluster>:<job_id_raw>:<submit time>", "node:...", ...
            subject text NOT NULL,
            step text NOT NULL,
            -- message, cancel, or alert (to the admins: a rule that would act on too many)
            kind text NOT NULL,
            cluster text NOT NULL DEFAULT '',
            job_id_raw bigint,
            submit_at timestamptz,
            job_id text NOT NULL DEFAULT '',
            user_name text NOT NULL DEFAULT '',
            account text NOT NULL DEFAULT '',
            node text NOT NULL DEFAULT '',
            decided_at timestamptz NOT NULL,
            decided_by text NOT NULL,
            reason text NOT NULL,
            evidence jsonb NOT NULL DEFAULT '{}',
            title text NOT NULL DEFAULT '',
            body_text text NOT NULL DEFAULT '',
            body_html text NOT NULL DEFAULT '',
            -- pending (deliveries to make), sent, failed, done (a cancel), not_done, uncertain
            status text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (rule, subject, step)
        )
        """
    )
    op.execute("CREATE INDEX action_log_job ON action_log (cluster, job_id_raw, submit_at)")
    op.execute("CREATE INDEX action_log_user ON action_log (user_name, decided_at)")
    op.execute("CREATE INDEX action_log_decided ON action_log (decided_at)")
    op.execute(
        """
        CREATE TABLE action_delivery (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            action_id bigint NOT NULL REFERENCES action_log (id) ON DELETE CASCADE,
            -- email, webhook, scancel
            channel text NOT NULL,
            -- the addresses (comma-separated), the webhook's name, the job id
            target text NOT NULL,
            -- who the target is to the rule: owner, coordinators, pis, admins, finance, or ''
            -- (an address the rule names, a webhook, a scancel)
            recipient_role text NOT NULL DEFAULT '',
            state text NOT NULL,
            tries integer NOT NULL DEFAULT 0,
            next_try_at timestamptz NOT NULL,
            -- who holds it while it is sent (host:pid)
            claimed_by text NOT NULL DEFAULT '',
            message_id text NOT NULL DEFAULT '',
            sent_at timestamptz,
            result text NOT NULL DEFAULT '',
            last_error text NOT NULL DEFAULT '',
            UNIQUE (action_id, channel, target)
        )
        """
    )
    op.execute(
        "CREATE INDEX action_delivery_due ON action_delivery (next_try_at) "
        "WHERE state IN ('pending', 'sending', 'committing')"
    )
    op.execute(
        """
        CREATE TABLE action_gpu_streak (
            gpu_uuid text NOT NULL,
            source text NOT NULL,
            node text NOT NULL,
            window_seconds real NOT NULL,
            last_window_end_at timestamptz NOT NULL,
            -- the start of the current stretch of idle windows (= last_window_end_at when the
            -- newest window was not idle), and of windows with no process on the GPU (NULL when
            -- the source cannot tell: DCGM)
            idle_since_at timestamptz NOT NULL,
            no_process_since_at timestamptz,
            -- the highest utilisation and memory use inside the idle stretch
            idle_util_max_percent real,
            idle_memory_used_max_bytes bigint,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (gpu_uuid, source)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE action_batch (
            batch_id bigint PRIMARY KEY REFERENCES ingest_batch (id) ON DELETE CASCADE,
            processed_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE action_exclusion (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            user_name text NOT NULL,
            starts_at timestamptz NOT NULL,
            ends_at timestamptz NOT NULL,
            reason text NOT NULL,
            created_by text NOT NULL,
            created_at timestamptz NOT NULL,
            revoked_at timestamptz,
            revoked_by text NOT NULL DEFAULT '',
            CHECK (ends_at > starts_at)
        )
        """
    )
    op.execute("CREATE INDEX action_exclusion_user ON action_exclusion (user_name, ends_at)")
    op.execute(
        """
        CREATE TABLE action_mail_request (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            cluster text NOT NULL,
            job_id text NOT NULL,
            job_id_raw bigint,
            recipient text NOT NULL,
            mail_type text NOT NULL,
            mail_subject text NOT NULL,
            received_at timestamptz NOT NULL,
            -- when the summary was decided (its action), or given up
            handled_at timestamptz,
            UNIQUE (cluster, job_id, recipient, mail_type)
        )
        """
    )
    op.execute(
        "CREATE INDEX action_mail_request_open ON action_mail_request (received_at) WHERE handled_at IS NULL"
    )
    for table, using in READER_POLICIES.items():
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {WRITER}")
        op.execute(f"GRANT SELECT ON {table} TO {READER}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY writer_all ON {table} TO {WRITER} USING (true) WITH CHECK (true)")
        op.execute(f"CREATE POLICY reader_scope ON {table} FOR SELECT TO {READER} USING ({using})")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON action_batch TO {WRITER}")
    op.execute(f"GRANT SELECT ON action_batch TO {READER}")


def downgrade() -> None:
    for table in (
        "action_mail_request",
        "action_exclusion",
        "action_batch",
        "action_gpu_streak",
        "action_delivery",
        "action_log",
    ):
        op.execute(f"DROP TABLE {table}")
