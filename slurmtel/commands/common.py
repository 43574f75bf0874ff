"""What every command shares: exit codes, Slurm-style arguments, identity, the run context."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pwd
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from slurmtel.access import Action, Identity, Role, Scope, allowed

# the exit codes, re-exported: every command module takes them from here
from slurmtel.commands import EXIT_ERROR as EXIT_ERROR
from slurmtel.commands import EXIT_OK as EXIT_OK
from slurmtel.commands import EXIT_PARTIAL as EXIT_PARTIAL
from slurmtel.commands import EXIT_USAGE as EXIT_USAGE
from slurmtel.config import Config
from slurmtel.errors import AccessDenied, ConfigError, ParseError, SourceUnavailable
from slurmtel.filters import JobFilter
from slurmtel.reports.render import FORMATS
from slurmtel.sources.base import RunContext, utc_now
from slurmtel.sources.io import run_command
from slurmtel.timeparse import report_window

if TYPE_CHECKING:
    from slurmtel.store.sql import Connection


log = logging.getLogger(__name__)


def add_window_arguments(parser: argparse.ArgumentParser, what: str = "the 1st of this month") -> None:
    parser.add_argument(
        "-S",
        "--starttime",
        dest="start",
        default=None,
        help=f"window start in site.timezone (sacct forms; default: {what})",
    )
    parser.add_argument("-E", "--endtime", dest="end", default=None, help="window end (default: now)")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-A", "--accounts", default=None, help="comma-separated accounts")
    parser.add_argument("-u", "--user", dest="users", default=None, help="comma-separated users")
    parser.add_argument(
        "-r", "--partition", dest="partitions", default=None, help="comma-separated partitions"
    )
    parser.add_argument("-M", "--clusters", default=None, help="comma-separated clusters")


def add_format_argument(parser: argparse.ArgumentParser, choices: tuple[str, ...] = FORMATS) -> None:
    parser.add_argument(
        "--format", choices=choices, default=choices[0], help=f"output format (default {choices[0]})"
    )
    add_wide_argument(parser)


def add_wide_argument(parser: argparse.ArgumentParser) -> None:
    """--wide: a table shows every column (none left out to fit the terminal) and full GPU
    UUIDs; slurmtel.cli.main hands it to the renderer (slurmtel.reports.render.WIDE)."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="tables: every column, however wide, and full GPU UUIDs (csv and json always have them)",
    )


def split_list(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def job_filter(args: argparse.Namespace) -> JobFilter:
    return JobFilter(
        accounts=split_list(args.accounts),
        users=split_list(args.users),
        partitions=split_list(args.partitions),
        clusters=split_list(args.clusters),
    )


def warn(message: str) -> None:
    print(f"slurmtel: warning: {message}", file=sys.stderr)


def warn_unknown(
    conn: Connection,
    scope: Scope,
    wanted: JobFilter | None = None,
    *,
    sources: Sequence[str] = (),
    also_known: Mapping[str, Collection[str]] | None = None,
) -> list[str]:
    """Warn once per filter value the data has never seen (`no such account 'x' in the data`);
    the report still runs and exits 0 with its empty result. See unknown_filter_warnings.
    Returns the warning lines."""
    lines = unknown_filter_warnings(conn, scope, wanted, sources=sources, also_known=also_known)
    for line in lines:
        warn(line)
    return lines


def unknown_filter_warnings(
    conn: Connection,
    scope: Scope,
    wanted: JobFilter | None = None,
    *,
    sources: Sequence[str] = (),
    also_known: Mapping[str, Collection[str]] | None = None,
) -> list[str]:
    """The warnings of warn_unknown, one per filter value the data has never seen, unprinted
    (the read API sends them in its document). Values are checked in SCOPE, so a caller who
    does not see everything learns nothing about users or accounts outside it: the answer, "in
    the data you may see", is the same whether they exist or not. ALSO_KNOWN adds values per
    kind that count as seen (budget accounts)."""
    from slurmtel.store.known import unknown_sources, unknown_values

    f = wanted or JobFilter()
    where = "in the data" if scope.everything else "in the data you may see"
    extra = also_known or {}
    lines: list[str] = []
    for kind, values in (
        ("account", f.accounts),
        ("user", f.users),
        ("partition", f.partitions),
        ("cluster", f.clusters),
    ):
        candidates = [v for v in dict.fromkeys(values) if v not in extra.get(kind, ())]
        for value in unknown_values(conn, kind, candidates, scope):
            lines.append(f"no such {kind} '{value}' {where}")
    if sources:
        from slurmtel.sources import SOURCES

        registered = sorted(SOURCES)
        known = ", ".join(registered)
        for value in unknown_sources(conn, list(dict.fromkeys(sources)), registered=registered):
            lines.append(f"no such source '{value}' in the data (known sources: {known})")
    return lines


def head_only(config: Config, command: str) -> None:
    """Refuse at once, on a login-node client (api.url, no database), a command that needs the
    database: ConfigError (exit 2) saying it runs on the head node. The CLI refuses every
    command that does not go through the API this way before it runs (slurmtel.cli); a command
    that goes through it for some of its options calls this for the others."""
    if config.api_client_only():
        raise ConfigError(config.head_only_message(command))


def site_now(config: Config) -> datetime:
    """What "now" is for a command (site.clock, or the wall clock), read without the database:
    a command checks its values against it before it opens one."""
    from slurmtel.clock import site_clock

    return site_clock(config, utc_now)()


def resolve_window(args: argparse.Namespace, config: Config, now: datetime) -> tuple[datetime, datetime]:
    """-S/-E in the site's zone; default -S is the start of the current month."""
    try:
        return report_window(args.start, args.end, now=now, zone=config.zone)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def current_identity(config: Config) -> Identity:
    """The caller, from the unix account running the CLI (DESIGN §8)."""
    uid = os.getuid()
    user = pwd.getpwuid(uid).pw_name
    if uid == 0 or user in config.access.admins:
        return Identity(user, Role.ADMIN)
    if user in config.access.finance:
        return Identity(user, Role.FINANCE)
    if config.database_url() is None:
        # the embedded database belongs to whoever runs it
        return Identity(user, Role.ADMIN)
    return Identity(user, Role.USER, coordinated_accounts(config, user))


def coordinated_accounts(config: Config, user: str) -> frozenset[str]:
    """The accounts USER coordinates in Slurm and, as in Slurm, their sub-accounts; none when
    sacctmgr cannot say (deny by default), only the named ones when the tree cannot be read."""
    from slurmtel.parsers.sacctmgr import COORDINATORS_ARGS, parse_coordinators, with_sub_accounts

    command = config.access.sacctmgr_command
    if not command:
        return frozenset()
    try:
        raw = run_command([command, *COORDINATORS_ARGS], timeout_seconds=30)
    except SourceUnavailable as exc:
        log.warning("cannot ask sacctmgr who coordinates which accounts (%s): no coordinator rights", exc)
        return frozenset()
    accounts = parse_coordinators(raw.decode("utf-8", "replace")).get(user, frozenset())
    if not accounts:
        return accounts
    try:
        parents = account_tree(config)
    except (SourceUnavailable, ParseError) as exc:
        log.warning("cannot read the account tree from sacctmgr (%s): sub-accounts not included", exc)
        return accounts
    return with_sub_accounts(accounts, parents)


def account_tree(config: Config) -> dict[str, frozenset[str]]:
    """account -> its parents, from `sacctmgr show account withassoc` (access.sacctmgr_command):
    coordinators' sub-accounts, budget roll-ups and statement roll-ups all read it here.
    SourceUnavailable when sacctmgr is not configured or fails, ParseError on output without
    the tree's columns."""
    from slurmtel.parsers.sacctmgr import ACCOUNT_TREE_ARGS, parse_account_parents

    command = config.access.sacctmgr_command
    if not command:
        raise SourceUnavailable("access.sacctmgr_command is empty")
    raw = run_command([command, *ACCOUNT_TREE_ARGS], timeout_seconds=30)
    return parse_account_parents(raw.decode("utf-8", "replace"))


def scope_for(config: Config, action: Action, identity: Identity | None = None) -> Scope:
    who = identity or current_identity(config)
    scope = allowed(who, action)
    if scope.is_empty:
        raise AccessDenied(f"{who.user} ({who.role.value}) may not {action.value.replace('_', ' ')}")
    return scope


@contextlib.contextmanager
def open_reader(config: Config) -> Iterator[tuple[Connection, datetime]]:
    """For a command that only reads (job, me, report): a connection with the schema checked,
    and the time it reads at (site.clock, or the wall clock). SQLAlchemy is not loaded for a
    PostgreSQL URL: it would cost the command half its time (slurmtel.store.sql)."""
    from slurmtel.clock import site_clock
    from slurmtel.store.reader import connect_reader

    with connect_reader(config) as conn:
        # utc_now is read here, so tests can patch it
        yield conn, site_clock(config, utc_now)()


def open_context(config: Config) -> RunContext:
    from slurmtel.clock import site_clock
    from slurmtel.store.engine import make_engine, require_schema

    engine = make_engine(config)
    require_schema(engine, config.database_description())
    # site.clock (demos, tests) or the wall clock; utc_now is read here, so tests can patch it
    return RunContext(config=config, engine=engine, clock=site_clock(config, utc_now))
