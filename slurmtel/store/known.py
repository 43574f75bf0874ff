"""Which filter values (-A, -u, -r, -M, --source) the data has never seen.

A report filtered on a typo is empty; the CLI says why (`commands.common.warn_unknown`). The
check runs in the caller's scope, so it cannot tell a plain user whether someone else's user or
account exists: a value outside the scope is "unknown" whether or not it is in the data.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurmtel.access import Scope
from slurmtel.store.sql import Connection, text

# filter kind -> column of job_attempt and pending_job
COLUMNS = {"account": "account", "user": "user_name", "partition": "partition", "cluster": "cluster"}

# node_state knows partitions and clusters with no job yet; it has no user or account, so only
# callers who see everything may learn from it
_NODE_STATE = {
    "partition": "EXISTS (SELECT 1 FROM node_state n WHERE t.v = ANY(n.partitions))",
    "cluster": "EXISTS (SELECT 1 FROM node_state n WHERE n.cluster = t.v)",
}


def unknown_values(conn: Connection, kind: str, values: Sequence[str], scope: Scope) -> list[str]:
    """VALUES (in order) that no job attempt or pending job in SCOPE has as its KIND."""
    if not values:
        return []
    column = COLUMNS[kind]
    nodes = _NODE_STATE.get(kind)
    node_clause = f"OR (CAST(:scope_all AS boolean) AND {nodes})" if nodes else ""
    sql = f"""
        SELECT t.v
        FROM unnest(CAST(:values AS text[])) WITH ORDINALITY AS t(v, i)
        WHERE NOT (
            EXISTS (SELECT 1 FROM job_attempt WHERE {column} = t.v AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts))
            OR EXISTS (SELECT 1 FROM pending_job WHERE {column} = t.v AND slurmtel_in_scope(user_name, account, :scope_all, :scope_users, :scope_accounts))
            {node_clause}
        )
        ORDER BY t.i
    """
    rows = conn.execute(text(sql), {"values": list(values), **scope.sql_params()})
    return [row[0] for row in rows]


def unknown_sources(conn: Connection, values: Sequence[str], registered: Sequence[str] = ()) -> list[str]:
    """VALUES (in order) neither REGISTERED nor named by any collect run or quarantined record."""
    skip = set(registered)
    wanted = [v for v in values if v not in skip]
    if not wanted:
        return []
    rows = conn.execute(
        text(
            """
            SELECT t.v
            FROM unnest(CAST(:values AS text[])) WITH ORDINALITY AS t(v, i)
            WHERE NOT EXISTS (SELECT 1 FROM collect_run r WHERE r.source = t.v)
              AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.source = t.v)
            ORDER BY t.i
            """
        ),
        {"values": wanted},
    )
    return [row[0] for row in rows]
