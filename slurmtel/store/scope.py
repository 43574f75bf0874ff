"""The SQL of a Scope (slurmtel.access decides who sees what; this is how a query says it)."""

from __future__ import annotations

# The one WHERE clause every scoped query uses, over a row with user_name and account; its
# bind parameters are Scope.sql_params().
SCOPE_SQL = (
    "(CAST(:scope_all AS boolean) OR user_name = ANY(CAST(:scope_users AS text[])) "
    "OR account = ANY(CAST(:scope_accounts AS text[])))"
)
