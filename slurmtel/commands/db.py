"""`slurmtel db upgrade | current`: the schema, only through Alembic; `slurmtel db roles`: the
login roles of the daemon, the API and Grafana (members of the group roles the migrations made)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurmtel.commands.argtypes import role_name
from slurmtel.commands.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from slurmtel.config import Config


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    db = commands.add_parser("db", help="database schema")
    actions = db.add_subparsers(title="actions", metavar="ACTION", required=True)
    actions.add_parser("upgrade", help="apply the Alembic migrations").set_defaults(handler=cmd_db_upgrade)
    actions.add_parser("current", help="show the schema revision").set_defaults(handler=cmd_db_current)
    roles = actions.add_parser(
        "roles",
        help="create the login roles of the daemon (writer), the API (reader) and Grafana (aggregate)",
        description="Creates each LOGIN role that does not exist and makes it a member of its group "
        "role: slurmtel_writer, slurmtel_reader, slurmtel_aggregate; with --password-dir, gives each a "
        "password (from DIR/ROLE.password, or a new one written there, mode 0600, with DIR/ROLE.url); "
        "with --scope-key-file (default api.scope_key_file), gives the database the API's scope key "
        "(making the file, mode 0600, when there is none). Run as the database owner with CREATEROLE, "
        "after `db upgrade`. Idempotent.",
    )
    roles.add_argument(
        "--password-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="each role's password: DIR/ROLE.password if it is there, else a new one written there "
        "(0600) with DIR/ROLE.url, a database URL for database.url_file",
    )
    roles.add_argument(
        "--scope-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the API's scope key (api.scope_key_file, the default): given to the database; made "
        "(0600) when FILE does not exist",
    )
    roles.add_argument(
        "--writer",
        type=role_name,
        default="slurmtel_daemon",
        help="the daemon's role (default slurmtel_daemon)",
    )
    roles.add_argument(
        "--reader", type=role_name, default="slurmtel_api", help="the API's role (default slurmtel_api)"
    )
    roles.add_argument(
        "--aggregate",
        type=role_name,
        default="slurmtel_grafana",
        help="Grafana's role: aggregate views only (default slurmtel_grafana)",
    )
    roles.set_defaults(handler=cmd_db_roles)


def cmd_db_upgrade(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import check_connection, make_engine
    from slurmtel.store.migrate import current_revision, upgrade

    engine = make_engine(config)
    check_connection(engine, config.database_description())
    before = current_revision(engine)
    upgrade(engine)
    after = current_revision(engine)
    print(f"schema at {after}" + (f" (was {before})" if before != after else " (already current)"))
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import check_connection, make_engine
    from slurmtel.store.migrate import current_revision, head_revision

    engine = make_engine(config)
    check_connection(engine, config.database_description())
    current, head = current_revision(engine), head_revision()
    print(f"current: {current or '(none)'}  head: {head}")
    return EXIT_OK if current == head else EXIT_ERROR


def cmd_db_roles(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import make_engine, require_schema
    from slurmtel.store.rls import install_scope_key
    from slurmtel.store.roles import (
        AGGREGATE_GROUP,
        READER_GROUP,
        WRITER_GROUP,
        check_groups,
        ensure_login_role,
        ensure_password,
    )

    wanted = ((args.writer, WRITER_GROUP), (args.reader, READER_GROUP), (args.aggregate, AGGREGATE_GROUP))
    if len({name for name, _ in wanted}) != len(wanted):
        print("slurmtel: --writer, --reader and --aggregate must be three different roles", file=sys.stderr)
        return EXIT_USAGE
    engine = make_engine(config)
    require_schema(engine, config.database_description())
    key_path = args.scope_key_file or (Path(config.api.scope_key_file) if config.api.scope_key_file else None)
    key, key_made = _scope_key(key_path) if key_path else (None, False)
    with engine.begin() as conn:
        check_groups(conn)
        results = [
            # Grafana's finance panels cut months in the session's time zone
            ensure_login_role(
                conn, name, group, timezone=config.timezone_name if group == AGGREGATE_GROUP else ""
            )
            for name, group in wanted
        ]
        passwords = (
            [ensure_password(conn, r.name, args.password_dir) for r in results] if args.password_dir else []
        )
        key_changed = install_scope_key(conn, key) if key is not None else False
    for r in results:
        membership = "made a member of" if r.granted else "already a member of"
        line = f"{r.name}: {'created' if r.created else 'exists'}, {membership} {r.group}"
        if r.timezone:
            line += f"; timezone {r.timezone} in this database"
        print(line)
    if passwords:
        url = engine.url
        for result, (password, made) in zip(results, passwords, strict=True):
            where = args.password_dir / f"{result.name}.password"
            if made:
                url_file = args.password_dir / f"{result.name}.url"
                _write_private(
                    url_file,
                    url.set(username=result.name, password=password).render_as_string(hide_password=False),
                )
                print(f"{result.name}: password set, written to {where} (0600) and {url_file}")
            else:
                print(f"{result.name}: password set from {where}")
    elif any(r.created for r in results):
        print(
            "new roles have no password: give them one with --password-dir DIR, or map them in "
            "pg_hba.conf (peer: `local <db> slurmtel_daemon peer map=slurmtel` with pg_ident.conf "
            "`slurmtel slurmtel slurmtel_daemon`; or cert: clientcert=verify-full and the role as the "
            "certificate's CN)"
        )
    if key_path is not None:
        state = "made" if key_made else "read"
        print(
            f"scope key {state} ({key_path}); the database "
            + ("now takes its proofs" if key_changed else "already held it")
            + "; `slurmtel serve` needs it as api.scope_key_file"
        )
    else:
        print(
            "no scope key (--scope-key-file or api.scope_key_file): a `serve` reading as the reader role "
            "sees no per-user rows until it has one"
        )
    return EXIT_OK


def _scope_key(path: Path) -> tuple[bytes, bool]:
    """The key in PATH, or a new one written there (0600); and whether it was made now."""
    from slurmtel.store.rls import new_scope_key, read_scope_key, write_scope_key

    try:
        return read_scope_key(path), False
    except FileNotFoundError:
        key = new_scope_key()
        write_scope_key(path, key)
        return key, True


def _write_private(path: Path, content: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, f"{content}\n".encode())
    finally:
        os.close(fd)
