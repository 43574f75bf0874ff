"""The scope of a transaction, for PostgreSQL's row-level security (migrations 0010 and 0016).

The API server, connected as a member of `slurmtel_reader`, calls set_transaction_scope at the
start of each request's transaction with the Scope slurmtel.access.allowed() gave the caller;
the policies then admit only the rows that Scope admits, as the database function
slurmtel_in_scope does in every query. Defence in depth: a query that forgot its scope still
returns nobody else's rows. The settings are per transaction (set_config's is_local): they end
with the commit or rollback, so a pooled connection never carries one request's scope into the
next; without them the reader sees no per-user rows at all.

The settings alone are no credential: any session of the reader may set them. Since 0016 the
policies admit rows only by a scope that carries its proof (slurmtel.scope_proof): the
HMAC-SHA256, by the scope key, of the settings' texts and of the session they were set in (the
backend's pid and start time, slurmtel_scope_session()). The key is the API's
(api.scope_key_file); the database holds it where the reader cannot read it (scope_key, written
by `slurmtel db roles`), and checks the proof in slurmtel_proven_scope, a SECURITY DEFINER
function. A reader's login without the key, or a proof made for another session or other
settings, reads no per-user row. The daemon (slurmtel_writer) and the schema owner are not
filtered by any of it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event, text

from slurmtel.access import Scope
from slurmtel.errors import ConfigError, SlurmtelError

# names the policies read
SCOPE_ALL_SETTING = "slurmtel.scope_all"
SCOPE_USERS_SETTING = "slurmtel.scope_users"
SCOPE_ACCOUNTS_SETTING = "slurmtel.scope_accounts"
SCOPE_PROOF_SETTING = "slurmtel.scope_proof"
# bytes of a scope key (HMAC-SHA256 takes up to 64 without hashing it first)
SCOPE_KEY_BYTES = 32
_SIGNER = "slurmtel_scope_signer"
_MESSAGE_TAG = "slurmtel-scope-1"


class ScopeOutsideTransaction(SlurmtelError):
    """set_transaction_scope was called with no transaction open: the setting would not hold."""


class ScopeKeyRefused(SlurmtelError):
    """The database does not take this server's scope proofs (another key, or none installed)."""

    kind = "config_error"


def array_literal(values: frozenset[str] | set[str] | list[str]) -> str:
    """VALUES as a PostgreSQL text[] literal, every element quoted ({"alice","a \\"b\\""}): the
    text that is signed is the text the policies cast, whatever characters a name holds."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in sorted(values))
    return "{" + ",".join(quoted) + "}"


def scope_message(session: str, scope_all: str, users: str, accounts: str) -> bytes:
    """What a proof signs, as the database's slurmtel_scope_message builds it: each part
    prefixed with its length in characters."""
    parts = (_MESSAGE_TAG, session, scope_all, users, accounts)
    return "".join(f"{len(p)}:{p}" for p in parts).encode()


def scope_settings(scope: Scope, key: bytes | None, session: str) -> dict[str, str]:
    """The four settings of SCOPE, proven for SESSION with KEY (no proof without a key: the
    owner, who row security does not filter, needs none)."""
    settings = {
        "scope_all": "on" if scope.everything else "off",
        "scope_users": array_literal(scope.users),
        "scope_accounts": array_literal(scope.accounts),
    }
    proof = ""
    if key is not None:
        message = scope_message(session, *settings.values())
        proof = hmac.new(key, message, hashlib.sha256).hexdigest()
    return {**settings, "scope_proof": proof}


_SET_SCOPE = text(
    f"SELECT set_config('{SCOPE_ALL_SETTING}', :scope_all, true), "
    f"set_config('{SCOPE_USERS_SETTING}', :scope_users, true), "
    f"set_config('{SCOPE_ACCOUNTS_SETTING}', :scope_accounts, true), "
    f"set_config('{SCOPE_PROOF_SETTING}', :scope_proof, true)"
)


def set_transaction_scope(conn: Connection, scope: Scope) -> None:
    """Make SCOPE the rows the rest of CONN's current transaction may read (as slurmtel_reader),
    proven with the key of sign_scopes when CONN's engine has one."""
    if not conn.in_transaction():
        raise ScopeOutsideTransaction("set_transaction_scope needs an open transaction (engine.begin())")
    key, session = conn.connection.info.get(_SIGNER, (None, ""))
    conn.execute(_SET_SCOPE, scope_settings(scope, key, session))


# engines whose connections prove their scopes, and with which key
_KEYS: weakref.WeakKeyDictionary[Engine, bytes] = weakref.WeakKeyDictionary()


def _remember_session(
    engine: Engine, dbapi_connection: Any, connection_record: Any
) -> tuple[bytes, str] | None:
    """The (key, session) a new connection of ENGINE signs with, kept with the connection."""
    signer = connection_record.info.get(_SIGNER)
    key = _KEYS.get(engine)
    if signer is not None or key is None:
        return signer
    cursor = dbapi_connection.cursor()
    cursor.execute("SELECT slurmtel_scope_session()")
    (session,) = cursor.fetchone()
    cursor.close()
    dbapi_connection.commit()
    connection_record.info[_SIGNER] = (key, session)
    return key, session


def sign_scopes(engine: Engine, key: bytes) -> Engine:
    """ENGINE's connections prove every scope set_transaction_scope sets with KEY."""
    first = engine not in _KEYS
    _KEYS[engine] = key
    if first:

        @event.listens_for(engine, "connect")
        def _signer(dbapi_connection: Any, connection_record: Any) -> None:
            _remember_session(engine, dbapi_connection, connection_record)

    return engine


def scope_sessions_to_everything(engine: Engine) -> Engine:
    """Every session of ENGINE sees every row (the scope set for the session, not a transaction),
    proven when sign_scopes gives ENGINE a key (before its first connection). Only for a pool
    that serves callers whose scope is everything: the read API's statements and closings
    (finance and admins), whose code opens its own transactions."""

    @event.listens_for(engine, "connect")
    def _everything(dbapi_connection: Any, connection_record: Any) -> None:
        key, session = _remember_session(engine, dbapi_connection, connection_record) or (None, "")
        settings = scope_settings(Scope(everything=True), key, session)
        cursor = dbapi_connection.cursor()
        cursor.execute(
            f"SELECT set_config('{SCOPE_ALL_SETTING}', %(scope_all)s, false), "
            f"set_config('{SCOPE_USERS_SETTING}', %(scope_users)s, false), "
            f"set_config('{SCOPE_ACCOUNTS_SETTING}', %(scope_accounts)s, false), "
            f"set_config('{SCOPE_PROOF_SETTING}', %(scope_proof)s, false)",
            settings,
        )
        cursor.close()
        dbapi_connection.commit()

    return engine


# --- the key: a file of the API server's, a row of the database's ----------------------------


def new_scope_key() -> bytes:
    return secrets.token_bytes(SCOPE_KEY_BYTES)


def read_scope_key(path: Path) -> bytes:
    """The key in PATH (hex). ConfigError when it is unreadable, not SCOPE_KEY_BYTES of hex, or
    readable or writable by anyone but its owner and group (FileNotFoundError when absent)."""
    from slurmtel.agent.token import read_token_file

    hexed = read_token_file(path, "api.scope_key_file")
    try:
        key = bytes.fromhex(hexed)
    except ValueError:
        raise ConfigError(f"api.scope_key_file {path}: not a hex key") from None
    if len(key) != SCOPE_KEY_BYTES:
        raise ConfigError(f"api.scope_key_file {path}: a key of {SCOPE_KEY_BYTES} bytes, not {len(key)}")
    return key


def write_scope_key(path: Path, key: bytes) -> None:
    """KEY to a new file PATH, mode 0600 (never over an existing file)."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{key.hex()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _pads(key: bytes) -> tuple[bytes, bytes]:
    block = key.ljust(64, b"\0")
    return bytes(b ^ 0x36 for b in block), bytes(b ^ 0x5C for b in block)


def install_scope_key(conn: Connection, key: bytes) -> bool:
    """Make KEY the database's scope key (as the owner); True when it changed."""
    inner, outer = _pads(key)
    current = conn.execute(text("SELECT inner_pad FROM scope_key")).scalar_one_or_none()
    if current is not None and bytes(current) == inner:
        return False
    conn.execute(
        text(
            "INSERT INTO scope_key (id, inner_pad, outer_pad) VALUES (true, :inner, :outer) "
            "ON CONFLICT (id) DO UPDATE SET inner_pad = excluded.inner_pad, outer_pad = excluded.outer_pad, "
            "created_at = now()"
        ),
        {"inner": inner, "outer": outer},
    )
    return True


def check_scope_proofs(engine: Engine) -> None:
    """ScopeKeyRefused when ENGINE's role is filtered by row security and the database does not
    take its proofs (no key, or another one): the API would answer every caller with no rows."""
    with engine.begin() as conn:
        filtered = conn.execute(
            text(
                "SELECT NOT (r.rolsuper OR r.rolbypassrls OR pg_has_role(r.oid, c.relowner, 'USAGE')) "
                "FROM pg_roles r, pg_class c WHERE r.rolname = current_user "
                "AND c.oid = CAST('job_attempt' AS regclass)"
            )
        ).scalar_one()
        if not filtered:
            return
        set_transaction_scope(conn, Scope(everything=True))
        proven = conn.execute(
            text("SELECT p.scope_all FROM slurmtel_proven_scope(slurmtel_scope_session()) p")
        ).scalar_one()
    if not proven:
        why = (
            "api.scope_key_file is not set"
            if engine not in _KEYS
            else "the database holds another scope key, or none"
        )
        raise ScopeKeyRefused(
            f"row security would show this server no rows: {why} (run `slurmtel db roles "
            "--scope-key-file FILE` as the database owner, FILE being api.scope_key_file)"
        )


def load_scope_key(path: str) -> bytes | None:
    """api.scope_key_file's key; None when none is configured. ConfigError when the file is
    missing or unusable."""
    if not path:
        return None
    try:
        return read_scope_key(Path(path))
    except FileNotFoundError:
        raise ConfigError(
            f"api.scope_key_file {path} does not exist: `slurmtel db roles --scope-key-file {path}` "
            "makes it (as the database owner)"
        ) from None
