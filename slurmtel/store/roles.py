"""Login roles for the daemon, the API and Grafana (`slurmtel db roles`).

Migration 0010 made the NOLOGIN group roles and gave them their privileges and row-level
security policies; a site's login roles only become members of them, so role names stay site
configuration and every privilege stays in the migrations. Idempotent: a role that exists is
kept (its password and attributes untouched), a membership that exists is left as it is.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, text

from slurmtel.errors import SchemaMissing, SlurmtelError

# the group roles of migration 0010
WRITER_GROUP, READER_GROUP, AGGREGATE_GROUP = "slurmtel_writer", "slurmtel_reader", "slurmtel_aggregate"
GROUPS = (WRITER_GROUP, READER_GROUP, AGGREGATE_GROUP)

# lower-case SQL identifiers only: never quoted differently from how they were typed
ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class RoleError(SlurmtelError):
    """A login role cannot serve as asked (it would pass row security, or holds another group)."""

    kind = "role_error"


@dataclass(frozen=True)
class RoleResult:
    name: str
    group: str
    created: bool
    # the membership in GROUP was granted by this call (False: it was there already)
    granted: bool
    # the session time zone set for it in this database ('' = none set)
    timezone: str = ""


def _ident(name: str) -> str:
    if not ROLE_NAME.fullmatch(name):
        raise ValueError(f"not a role name slurmtel makes: {name!r}")
    return f'"{name}"'


def check_groups(conn: Connection) -> None:
    missing = set(GROUPS) - set(
        conn.execute(
            text("SELECT rolname FROM pg_roles WHERE rolname = ANY(:names)"), {"names": list(GROUPS)}
        )
        .scalars()
        .all()
    )
    if missing:
        raise SchemaMissing(
            f"group roles {', '.join(sorted(missing))} are missing: run `slurmtel db upgrade` first"
        )


def _unsafe_reason(conn: Connection, name: str, group: str) -> str:
    """Why NAME may not be GROUP's login ('' = it may): a reader or aggregate role must be held
    by row security and its grants, and hold no more than its group."""
    if group == WRITER_GROUP:
        return ""
    row = conn.execute(
        text(
            """
            SELECT r.rolsuper, r.rolbypassrls,
                   pg_has_role(r.oid, c.relowner, 'USAGE') AS owner_rights,
                   ARRAY(SELECT g FROM unnest(CAST(:groups AS text[])) AS g
                         WHERE g <> :group AND pg_has_role(r.oid, g, 'USAGE')) AS other_groups
            FROM pg_roles r, pg_class c
            WHERE r.rolname = :name AND c.oid = CAST('job_attempt' AS regclass)
            """
        ),
        {"name": name, "group": group, "groups": list(GROUPS)},
    ).one_or_none()
    if row is None:
        return ""
    if row.rolsuper:
        return "is a superuser (row security never applies to it)"
    if row.rolbypassrls:
        return "has BYPASSRLS (row security never applies to it)"
    if row.owner_rights:
        return "has the table owner's rights (row security does not apply to the owner)"
    if row.other_groups:
        return f"is also a member of {', '.join(row.other_groups)}"
    return ""


def ensure_login_role(conn: Connection, name: str, group: str, *, timezone: str = "") -> RoleResult:
    """NAME exists as a LOGIN role and is a member of GROUP; with TIMEZONE, its sessions in this
    database use that time zone (Grafana cuts months in the session's zone)."""
    if group not in GROUPS:
        raise ValueError(f"not a slurmtel group role: {group!r}")
    quoted = _ident(name)
    reason = _unsafe_reason(conn, name, group)
    if reason:
        raise RoleError(f"role {name} cannot be the {group} login: it {reason}")
    created = (
        conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :name"), {"name": name}).first() is None
    )
    if created:
        # no password: the admin sets one, or authenticates it by peer or certificate
        conn.execute(text(f"CREATE ROLE {quoted} LOGIN"))
    granted = not conn.execute(
        text(
            "SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
            "JOIN pg_roles r ON r.oid = m.member WHERE g.rolname = :group AND r.rolname = :name"
        ),
        {"group": group, "name": name},
    ).first()
    if granted:
        conn.execute(text(f"GRANT {group} TO {quoted}"))
    if timezone:
        # literals, not bind parameters (ALTER ROLE takes none), their quotes doubled; sent as
        # they are (no bind-parameter parsing of the text)
        zone = timezone.replace("'", "''")
        database = conn.execute(text("SELECT current_database()")).scalar_one().replace('"', '""')
        conn.exec_driver_sql(f"ALTER ROLE {quoted} IN DATABASE \"{database}\" SET timezone = '{zone}'")
    return RoleResult(name, group, created, granted, timezone)


def ensure_password(conn: Connection, name: str, directory: Path) -> tuple[str, bool]:
    """NAME's password: DIRECTORY/NAME.password when it is there (it must be private), else a new
    one written there (mode 0600); set on the role as a SCRAM-SHA-256 verifier made here, so the
    password itself never reaches the server or its log. Returns it and whether it was made now."""
    from slurmtel.agent.token import read_token_file

    quoted = _ident(name)
    path = directory / f"{name}.password"
    made = False
    try:
        password = read_token_file(path, "password file")
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        password = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, f"{password}\n".encode())
        finally:
            os.close(fd)
        made = True
    pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
    verifier = pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256").decode()
    conn.exec_driver_sql(f"ALTER ROLE {quoted} PASSWORD '{verifier}'")
    return password, made
