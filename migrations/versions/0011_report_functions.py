"""report functions: the SQL every report shares, as named functions

Revision ID: 0011
Revises: 0010

What several reports, attribution and chargeback all mean by "in the caller's scope", "matches
the -A/-u/-r/-M filter", "failed", "active in the window" and "GPU-seconds inside the window" is
defined here once, so that no report composes it from a string another module exports, and a
change to any of them is a migration that every query sees at once.

All are LANGUAGE sql, IMMUTABLE, one expression, not STRICT: PostgreSQL inlines them into the
calling query, so a call plans exactly like the expression written out (indexes and constant
folding of the bound parameters included).
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

FUNCTIONS = {
    # access.Scope: everything, or the caller's own user name, or one of the accounts they
    # coordinate (sub-accounts are already in the list)
    "slurmtel_in_scope(p_user text, p_account text, scope_all boolean, scope_users text[], "
    "scope_accounts text[])": (
        "boolean",
        "SELECT scope_all OR p_user = ANY(scope_users) OR p_account = ANY(scope_accounts)",
    ),
    # JobFilter: Slurm's -A/-u/-r/-M; an empty list restricts nothing
    "slurmtel_job_filter(p_cluster text, p_account text, p_user text, p_partition text, "
    "f_accounts text[], f_users text[], f_partitions text[], f_clusters text[])": (
        "boolean",
        """SELECT (cardinality(f_accounts) = 0 OR p_account = ANY(f_accounts))
              AND (cardinality(f_users) = 0 OR p_user = ANY(f_users))
              AND (cardinality(f_partitions) = 0 OR p_partition = ANY(f_partitions))
              AND (cardinality(f_clusters) = 0 OR p_cluster = ANY(f_clusters))""",
    ),
    # the outcome classes whose GPU-hours are failed GPU-hours (DESIGN §4)
    "slurmtel_failed(p_outcome text)": (
        "boolean",
        "SELECT p_outcome IN ('user_failure', 'system_failure')",
    ),
    # a statement's GPU model: '' (no single typed GPU TRES) is 'unknown', no GPU is 'none'
    "slurmtel_gpu_model(p_alloc_gpus integer, p_gpu_model text)": (
        "text",
        "SELECT CASE WHEN p_alloc_gpus = 0 THEN 'none' WHEN p_gpu_model = '' THEN 'unknown' "
        "ELSE p_gpu_model END",
    ),
    # seconds an attempt has run: to its end, or to w_now while it runs; NULL before it starts
    "slurmtel_elapsed_seconds(p_start_at timestamptz, p_end_at timestamptz, w_now timestamptz)": (
        "numeric",
        "SELECT CASE WHEN p_start_at IS NULL THEN NULL "
        "ELSE extract(epoch FROM coalesce(p_end_at, w_now) - p_start_at) END",
    ),
    # an attempt is in [w_start, w_end) when it ran during it or, never started, ended or waited
    # in it; a running attempt runs until w_now
    "slurmtel_attempt_in_window(p_start_at timestamptz, p_end_at timestamptz, "
    "p_submit_at timestamptz, w_start timestamptz, w_end timestamptz, w_now timestamptz)": (
        "boolean",
        """SELECT coalesce(p_start_at, p_end_at, p_submit_at) < w_end
              AND coalesce(p_end_at, w_now) >= w_start""",
    ),
    # allocated GPU-seconds of an attempt inside [w_start, w_end): GPUs x the exact overlap of
    # [start, end or w_now) with the window, so adjacent windows add up and agree with sreport
    "slurmtel_window_gpu_seconds(p_alloc_gpus integer, p_start_at timestamptz, "
    "p_end_at timestamptz, w_start timestamptz, w_end timestamptz, w_now timestamptz)": (
        "numeric",
        """SELECT CASE WHEN p_start_at IS NULL THEN 0
                  ELSE p_alloc_gpus * greatest(0, extract(epoch FROM
                      least(coalesce(p_end_at, w_now), w_end) - greatest(p_start_at, w_start)))
                  END""",
    ),
}


WINDOWED_ATTEMPTS = (
    "slurmtel_windowed_attempts(w_start timestamptz, w_end timestamptz, w_now timestamptz, "
    "scope_all boolean, scope_users text[], scope_accounts text[], "
    "f_accounts text[], f_users text[], f_partitions text[], f_clusters text[])"
)


def create_windowed_attempts() -> None:
    """slurmtel_windowed_attempts(window, now, scope, filter): the attempts in the window that
    the scope and the filter admit, every column of job_attempt_outcome plus gpu_seconds (their
    GPU-seconds inside the window). The columns are read from the view as it is now: a migration
    that changes job_attempt_outcome calls this again (tests/test_migrations.py checks)."""
    columns = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT quote_ident(attname) || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'job_attempt_outcome'::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum"
        )
        .scalars()
        .all()
    )
    op.execute(
        f"""
        CREATE FUNCTION {WINDOWED_ATTEMPTS}
        RETURNS TABLE ({", ".join(columns)}, gpu_seconds numeric)
        LANGUAGE sql STABLE PARALLEL SAFE AS $body$
            SELECT a.*, slurmtel_window_gpu_seconds(a.alloc_gpus, a.start_at, a.end_at, w_start, w_end, w_now)
            FROM job_attempt_outcome a
            WHERE slurmtel_attempt_in_window(a.start_at, a.end_at, a.submit_at, w_start, w_end, w_now)
              AND slurmtel_in_scope(a.user_name, a.account, scope_all, scope_users, scope_accounts)
              AND slurmtel_job_filter(a.cluster, a.account, a.user_name, a.partition,
                                      f_accounts, f_users, f_partitions, f_clusters)
        $body$
        """
    )


def upgrade() -> None:
    for signature, (returns, body) in FUNCTIONS.items():
        op.execute(
            f"CREATE FUNCTION {signature} RETURNS {returns} "
            f"LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $body$ {body} $body$"
        )
    create_windowed_attempts()


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {WINDOWED_ATTEMPTS}")
    for signature in FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
