"""`slurmtel db upgrade | current`: the schema, only through Alembic."""

from __future__ import annotations

import argparse

from slurmtel.commands.common import EXIT_ERROR, EXIT_OK
from slurmtel.config import Config


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    db = commands.add_parser("db", help="database schema")
    actions = db.add_subparsers(title="actions", metavar="ACTION", required=True)
    actions.add_parser("upgrade", help="apply the Alembic migrations").set_defaults(handler=cmd_db_upgrade)
    actions.add_parser("current", help="show the schema revision").set_defaults(handler=cmd_db_current)


def cmd_db_upgrade(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import check_connection, make_engine
    from slurmtel.store.migrate import current_revision, upgrade

    engine = make_engine(config)
    check_connection(engine)
    before = current_revision(engine)
    upgrade(engine)
    after = current_revision(engine)
    print(f"schema at {after}" + (f" (was {before})" if before != after else " (already current)"))
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.engine import check_connection, make_engine
    from slurmtel.store.migrate import current_revision, head_revision

    engine = make_engine(config)
    check_connection(engine)
    current, head = current_revision(engine), head_revision()
    print(f"current: {current or '(none)'}  head: {head}")
    return EXIT_OK if current == head else EXIT_ERROR
