"""`slurmtel db upgrade | current`: the schema, only through Alembic; `slurmtel db roles`: the
login roles of the daemon, the API and Grafana (members of the group roles the migrations made)."""

from __future__ import annotations

import argparse
import sys

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
        description="Creates each LOGIN role that does not exist (no password: set one, or use peer or "
        "certificate authentication) and makes it a member of its group role: slurmtel_writer, "
        "slurmtel_reader, slurmtel_aggregate. Run as a role with CREATEROLE, after `db upgrade`. "
        "Idempotent.",
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
    from slurmtel.store.roles import (
        AGGREGATE_GROUP,
        READER_GROUP,
        WRITER_GROUP,
        check_groups,
        ensure_login_role,
    )

    wanted = ((args.writer, WRITER_GROUP), (args.reader, READER_GROUP), (args.aggregate, AGGREGATE_GROUP))
    if len({name for name, _ in wanted}) != len(wanted):
        print("slurmtel: --writer, --reader and --aggregate must be three different roles", file=sys.stderr)
        return EXIT_USAGE
    engine = make_engine(config)
    require_schema(engine, config.database_description())
    with engine.begin() as conn:
        check_groups(conn)
        results = [
            # Grafana's finance panels cut months in the session's time zone
            ensure_login_role(
                conn, name, group, timezone=config.timezone_name if group == AGGREGATE_GROUP else ""
            )
            for name, group in wanted
        ]
    for r in results:
        membership = "made a member of" if r.granted else "already a member of"
        line = f"{r.name}: {'created' if r.created else 'exists'}, {membership} {r.group}"
        if r.timezone:
            line += f"; timezone {r.timezone} in this database"
        print(line)
    if any(r.created for r in results):
        print(
            "new roles have no password: ALTER ROLE ... PASSWORD, or peer/cert authentication in pg_hba.conf"
        )
    return EXIT_OK
