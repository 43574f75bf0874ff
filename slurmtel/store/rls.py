"""The scope of a transaction, for PostgreSQL's row-level security (migration 0010).

The API server, connected as a member of `slurmtel_reader`, calls set_transaction_scope at the
start of each request's transaction with the Scope slurmtel.access.allowed() gave the caller;
the policies then admit only the rows that Scope admits, as the database function slurmtel_in_scope does in every query.
Defence in depth: a query that forgot its scope still returns nobody else's rows. The settings
are per transaction (set_config's is_local): they end with the commit or rollback, so a pooled
connection never carries one request's scope into the next; without them the reader sees no
per-user rows at all.

The settings are not a credential: any session of the reader may set them. What keeps them
honest is that the reader's login exists only on the API server. The daemon (slurmtel_writer)
and the schema owner are not filtered by them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, event, text

from slurmtel.access import Scope
from slurmtel.errors import SlurmtelError

# names the policies of migration 0010 read
SCOPE_ALL_SETTING = "slurmtel.scope_all"
SCOPE_USERS_SETTING = "slurmtel.scope_users"
SCOPE_ACCOUNTS_SETTING = "slurmtel.scope_accounts"


class ScopeOutsideTransaction(SlurmtelError):
    """set_transaction_scope was called with no transaction open: the setting would not hold."""


# text[] -> text makes the array literal ('{alice,"a b"}') the policies cast back: PostgreSQL
# quotes the names, whatever characters they hold
_SET_SCOPE = text(
    f"SELECT set_config('{SCOPE_ALL_SETTING}', CASE WHEN :scope_all THEN 'on' ELSE 'off' END, true), "
    f"set_config('{SCOPE_USERS_SETTING}', CAST(CAST(:scope_users AS text[]) AS text), true), "
    f"set_config('{SCOPE_ACCOUNTS_SETTING}', CAST(CAST(:scope_accounts AS text[]) AS text), true)"
)


def set_transaction_scope(conn: Connection, scope: Scope) -> None:
    """Make SCOPE the rows the rest of CONN's current transaction may read (as slurmtel_reader)."""
    if not conn.in_transaction():
        raise ScopeOutsideTransaction("set_transaction_scope needs an open transaction (engine.begin())")
    conn.execute(_SET_SCOPE, scope.sql_params())


def scope_sessions_to_everything(engine: Engine) -> Engine:
    """Every session of ENGINE sees every row (the scope set for the session, not a transaction).
    Only for a pool that serves callers whose scope is everything: the read API's statements and
    closings (finance and admins), whose code opens its own transactions."""

    @event.listens_for(engine, "connect")
    def _everything(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SELECT set_config('{SCOPE_ALL_SETTING}', 'on', false)")
        cursor.close()
        dbapi_connection.commit()

    return engine
