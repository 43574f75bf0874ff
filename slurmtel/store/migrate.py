"""Alembic, driven from code: `slurmtel db upgrade` and the schema check.

The schema check every command makes (slurmtel.store.engine.require_schema) needs only two
revisions: the database's (one query of alembic_version) and the newest of the migrations
(their `revision =` / `down_revision =` lines). Neither loads alembic, which costs a command
more than its query; `db upgrade` and `db downgrade` do.
"""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.errors import SchemaMissing
from slurmtel.store.sql import text

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig
    from sqlalchemy import Engine

    from slurmtel.store.sql import Connection

# alembic's default version table, in the schema the connection's search_path names first
VERSION_TABLE = "alembic_version"
# `revision = "0011"`, `down_revision: str | None = "0010"`, `down_revision = ("a", "b")`
_ASSIGNMENT = re.compile(r"^(?P<name>revision|down_revision)\b[^=\n]*=(?P<value>[^\n#]+)", re.MULTILINE)


def _script_location() -> Path:
    return Path(str(resources.files("slurmtel.migrations")))


def alembic_config(engine: Engine | None = None) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(_script_location()))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    """The newest migration's revision: the one no other migration names as its down_revision
    (what alembic's ScriptDirectory.get_current_head says, tests/test_cli_start.py)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (_script_location() / "versions").glob("*.py"):
        revision, down = _revision_of(path)
        if revision is not None:
            revisions.add(revision)
            parents.update(down)
    heads = revisions - parents
    if len(heads) != 1:
        # several heads (a merge to come) or none read: alembic says what it makes of them
        return _alembic_head()
    return heads.pop()


def _revision_of(path: Path) -> tuple[str | None, tuple[str, ...]]:
    """The module-level `revision` and `down_revision` of a migration file, read, not run."""
    revision: str | None = None
    down: tuple[str, ...] = ()
    for match in _ASSIGNMENT.finditer(path.read_text(encoding="utf-8")):
        try:
            value = ast.literal_eval(match["value"].strip())
        except (ValueError, SyntaxError):
            continue
        if match["name"] == "revision":
            revision = value if isinstance(value, str) else None
        else:
            down = (value,) if isinstance(value, str) else tuple(value or ())
    return revision, down


def _alembic_head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The database's revision, None when it has no slurmtel schema (no version table, or an
    empty one)."""
    with engine.connect() as conn:
        return schema_revision(conn)


def schema_revision(conn: Connection) -> str | None:
    """current_revision, on a connection."""
    if conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": VERSION_TABLE}).scalar_one():
        rows = list(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
    else:
        rows = []
    if len(rows) > 1:
        # as alembic's MigrationContext.get_current_revision: one head or none
        raise RuntimeError(f"the database is at several revisions ({', '.join(sorted(rows))})")
    return rows[0] if rows else None


def check_revision(current: str | None, database: str = "the database") -> None:
    """Raise SchemaMissing unless CURRENT (the database's revision) is this slurmtel's head.
    DATABASE names the database and why it is the one (Config.database_description)."""
    head = head_revision()
    if current is None:
        raise SchemaMissing(f"{database} has no slurmtel schema yet: run `slurmtel db upgrade` first")
    if current != head:
        raise SchemaMissing(
            f"the schema of {database} is at {current}, this slurmtel needs {head}: run `slurmtel db upgrade`"
        )


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)
