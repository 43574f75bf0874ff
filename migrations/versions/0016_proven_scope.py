"""proven scope: row security trusts only a scope the API signs with a key the reader cannot read

Revision ID: 0016
Revises: 0015

Until now the reader's policies read the scope from three settings (slurmtel.scope_all,
scope_users, scope_accounts) that any session of the reader may set: whoever had the reader's
login (a Grafana host, a leaked config) typed `SET slurmtel.scope_all = on` and read every row.
Now a policy admits rows only by a scope that carries a proof:

- scope_key: the HMAC-SHA256 key, kept as its inner and outer pads (key XOR 0x36 / 0x5c, 64
  bytes each), one row, written by `slurmtel db roles` as the owner from the API's
  api.scope_key_file. No role of slurmtel's may read it (the default privileges of 0010 are
  taken back).
- slurmtel.scope_proof: the hex HMAC-SHA256, by that key, of the three settings' texts and of
  the session they were set in (slurmtel_scope_session(): the backend's pid and start time), each
  part prefixed with its length. The API (slurmtel.store.rls.set_transaction_scope) sets it with
  the scope; a proof made for another session, or for other settings, proves nothing.
- slurmtel_proven_scope(session): SECURITY DEFINER (it reads scope_key as the owner); the scope
  of the settings when the proof is theirs, else nothing (scope_all false, no users, no
  accounts). The policies call it with the session computed in the caller's own context, once
  per query each (an InitPlan), so the rows are filtered as before: `user_name = ANY($1)`.

Every reader policy of 0010, 0013 and 0014 is re-created from its decision (own rows, rows of a
visible attempt, everything only) with the proven scope. The writer and the owner are not
filtered, as before. The downgrade restores the unproven policies and drops the key.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

WRITER, READER, AGGREGATE = "slurmtel_writer", "slurmtel_reader", "slurmtel_aggregate"

_SESSION_FUNCTION = """
    -- the session a proof is bound to: this backend's pid and start time (not secret)
    CREATE FUNCTION slurmtel_scope_session() RETURNS text
    LANGUAGE sql STABLE PARALLEL RESTRICTED AS $$
        SELECT pg_backend_pid()::text || '@'
               || to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
        FROM pg_stat_get_activity(pg_backend_pid()) a
    $$
"""

_MESSAGE_FUNCTION = """
    -- what a proof signs: each part prefixed with its length (no two scopes sign alike)
    CREATE FUNCTION slurmtel_scope_message(session text, s_all text, s_users text, s_accounts text)
    RETURNS bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT convert_to(
            length('slurmtel-scope-1') || ':slurmtel-scope-1'
            || length(session) || ':' || session
            || length(s_all) || ':' || s_all
            || length(s_users) || ':' || s_users
            || length(s_accounts) || ':' || s_accounts,
            'UTF8')
    $$
"""

_PROVEN_FUNCTION = """
    CREATE FUNCTION slurmtel_proven_scope(
        session text, OUT scope_all boolean, OUT scope_users text[], OUT scope_accounts text[])
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE
        s_all text := coalesce(current_setting('slurmtel.scope_all', true), '');
        s_users text := coalesce(current_setting('slurmtel.scope_users', true), '');
        s_accounts text := coalesce(current_setting('slurmtel.scope_accounts', true), '');
        s_proof text := coalesce(current_setting('slurmtel.scope_proof', true), '');
        pads record;
    BEGIN
        scope_all := false;
        scope_users := '{}';
        scope_accounts := '{}';
        IF session IS NULL OR s_proof !~ '^[0-9a-f]{64}$' THEN
            RETURN;
        END IF;
        SELECT k.inner_pad, k.outer_pad INTO pads FROM public.scope_key k;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF sha256(pads.outer_pad || sha256(pads.inner_pad
                  || public.slurmtel_scope_message(session, s_all, s_users, s_accounts)))
           <> decode(s_proof, 'hex') THEN
            RETURN;
        END IF;
        scope_all := s_all = 'on';
        scope_users := CAST(coalesce(nullif(s_users, ''), '{}') AS text[]);
        scope_accounts := CAST(coalesce(nullif(s_accounts, ''), '{}') AS text[]);
    END $$
"""

# once per query each: uncorrelated scalar subqueries are InitPlans
_ALL = "(SELECT p.scope_all FROM slurmtel_proven_scope(slurmtel_scope_session()) p)"
_USERS = "CAST((SELECT p.scope_users FROM slurmtel_proven_scope(slurmtel_scope_session()) p) AS text[])"
_ACCOUNTS = "CAST((SELECT p.scope_accounts FROM slurmtel_proven_scope(slurmtel_scope_session()) p) AS text[])"

# the decisions of 0010, 0013 and 0014, table by table
OWN_ROWS = ("job_attempt", "pending_job", "retry_link")
OF_ATTEMPT = ("gpu_attribution", "gpu_allocation", "attempt_node_day")
EVERYTHING_ONLY = (
    "quarantine",
    "gpu_job_span",
    "nccl_log",
    "nccl_run",
    "nccl_run_node",
    "nccl_pickup",
    "chargeback_statement",
    "chargeback_statement_voided",
    "chargeback_audit",
    "node_day_allocation",
    "gpu_attribution_part",
    "attribution_progress",
)

# the unproven settings as 0010/0013/0014 read them (for the downgrade)
_OLD_ALL = "coalesce(current_setting('slurmtel.scope_all', true), '') = 'on'"
_OLD_USERS = "ARRAY(SELECT unnest(CAST(coalesce(nullif(current_setting('slurmtel.scope_users', true), ''), '{}') AS text[])))"
_OLD_ACCOUNTS = "ARRAY(SELECT unnest(CAST(coalesce(nullif(current_setting('slurmtel.scope_accounts', true), ''), '{}') AS text[])))"


def policies(all_: str, users: str, accounts: str) -> dict[str, str]:
    """Each table's USING clause, from the three scope expressions (the arrays are expressions,
    CAST((SELECT ...) AS text[]): ANY (SELECT ...) would compare with the subquery's rows)."""
    own = f"({all_} OR user_name = ANY ({users}) OR account = ANY ({accounts}))"
    of_attempt = (
        f"({all_} OR EXISTS (SELECT 1 FROM job_attempt a WHERE a.cluster = {{t}}.cluster "
        "AND a.job_id_raw = {t}.job_id_raw AND a.submit_at = {t}.submit_at))"
    )
    using = dict.fromkeys(OWN_ROWS, own)
    using.update({t: of_attempt.format(t=t) for t in OF_ATTEMPT})
    using.update(dict.fromkeys(EVERYTHING_ONLY, all_))
    return using


def _recreate(using: dict[str, str]) -> None:
    for table, expression in using.items():
        op.execute(f"DROP POLICY reader_scope ON {table}")
        op.execute(f"CREATE POLICY reader_scope ON {table} FOR SELECT TO {READER} USING ({expression})")


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE scope_key (
            id boolean PRIMARY KEY DEFAULT true CHECK (id),
            inner_pad bytea NOT NULL CHECK (length(inner_pad) = 64),
            outer_pad bytea NOT NULL CHECK (length(outer_pad) = 64),
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # 0010's default privileges gave every new table to the writer and the reader: not this one
    op.execute(f"REVOKE ALL ON scope_key FROM PUBLIC, {WRITER}, {READER}, {AGGREGATE}")
    op.execute("ALTER TABLE scope_key ENABLE ROW LEVEL SECURITY")
    # sent as they are: their colons (':', HH24:MI) are SQL, not bind parameters
    bind = op.get_bind()
    for function in (_SESSION_FUNCTION, _MESSAGE_FUNCTION, _PROVEN_FUNCTION):
        bind.exec_driver_sql(function)
    op.execute("REVOKE ALL ON FUNCTION slurmtel_proven_scope(text) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION slurmtel_proven_scope(text) TO {READER}")
    _recreate(policies(_ALL, _USERS, _ACCOUNTS))


def downgrade() -> None:
    _recreate(policies(_OLD_ALL, _OLD_USERS, _OLD_ACCOUNTS))
    op.execute("DROP FUNCTION slurmtel_proven_scope(text)")
    op.execute("DROP FUNCTION slurmtel_scope_message(text, text, text, text)")
    op.execute("DROP FUNCTION slurmtel_scope_session()")
    op.execute("DROP TABLE scope_key")
