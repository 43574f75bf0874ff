"""`slurmtel report budget`: per account and period, budget, used, committed, remaining and
the projected date of exhaustion (README "### Budgets").

Access: VIEW_AGGREGATES. Rows are the budgets of accounts in the caller's scope (admins and
finance: all; a coordinator: the accounts they coordinate and their sub-accounts).
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime
from typing import TYPE_CHECKING

from slurmtel.access import EVERYTHING, Action, Scope
from slurmtel.commands import common
from slurmtel.commands.common import (
    EXIT_OK,
    account_tree,
    add_format_argument,
    open_context,
    scope_for,
    split_list,
    warn_unknown,
)
from slurmtel.config import Config
from slurmtel.errors import ConfigError, ParseError, SourceUnavailable
from slurmtel.filters import JobFilter
from slurmtel.reports.render import render
from slurmtel.sources.io import run_command
from slurmtel.timeparse import parse_slurm_time

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from slurmtel.budget import Budget, BudgetRow, Period
    from slurmtel.chargeback import UsageFigure

log = logging.getLogger(__name__)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    budget: argparse.ArgumentParser = reports.add_parser(
        "budget", help="budgets per account and period: used, committed, remaining, projected exhaustion"
    )
    budget.add_argument("-A", "--accounts", default=None, help="comma-separated accounts (budget accounts)")
    budget.add_argument(
        "--at", default=None, help="the moment to report at (sacct time forms, site.timezone; default now)"
    )
    add_format_argument(budget)
    budget.set_defaults(handler=cmd_report_budget)


def warn(message: str) -> None:
    print(f"slurmtel: warning: {message}", file=sys.stderr)


def read_slurm_budgets(config: Config) -> dict[str, int]:
    """Accounts' GrpTRESMins gres/gpu from sacctmgr; {} (with a warning) when it cannot say."""
    from slurmtel.parsers.sacctmgr import GRP_TRES_MINS_ARGS, parse_grp_tres_mins

    command = config.access.sacctmgr_command
    if not command:
        warn(
            "chargeback.budgets_from_slurm is on but access.sacctmgr_command is empty: configured budgets only"
        )
        return {}
    try:
        raw = run_command([command, *GRP_TRES_MINS_ARGS], timeout_seconds=30)
        return parse_grp_tres_mins(raw.decode("utf-8", "replace"))
    except (SourceUnavailable, ParseError) as exc:
        warn(f"cannot read GrpTRESMins from sacctmgr ({exc}): configured budgets only")
        return {}


def read_account_parents(config: Config) -> dict[str, frozenset[str]] | None:
    """The account tree, or None (with a warning) when it cannot be read."""
    try:
        return account_tree(config)
    except (SourceUnavailable, ParseError) as exc:
        warn(f"cannot read the account tree from sacctmgr ({exc}): budgets cover only their own account")
        return None


def budget_rows(
    conn: Connection,
    config: Config,
    budgets: list[Budget],
    parents: dict[str, frozenset[str]] | None,
    at: datetime,
    scope: Scope,
) -> list[BudgetRow]:
    """The rows of BUDGETS at AT, usage limited to SCOPE."""
    from slurmtel.budget import budget_row, committed_figures, month_slices, period_of, used_figures
    from slurmtel.chargeback import priced_tres
    from slurmtel.parsers.sacctmgr import with_sub_accounts
    from slurmtel.store.budget import running_attempts, usage_by_month

    zone = config.zone
    chargeback = config.chargeback
    billing = chargeback.use_billing_tres
    # usage of the accounts the caller may see as a whole (not only their own jobs in them)
    usage_scope = EVERYTHING if scope.everything else Scope(accounts=scope.accounts)
    running = running_attempts(conn, at=at, scope=usage_scope, billing=billing)
    by_kind: dict[str, tuple[Period, dict[str, list[UsageFigure]]]] = {}
    for kind in sorted({b.period for b in budgets}):
        period = period_of(kind, at, zone)
        slices = month_slices(period, at, zone)
        by_kind[kind] = (
            period,
            usage_by_month(conn, slices, now=at, scope=usage_scope, tres=priced_tres(chargeback)),
        )
    rows = []
    for budget in budgets:
        covered = with_sub_accounts({budget.account}, parents) if parents is not None else {budget.account}
        period, usage = by_kind[budget.period]
        mine = {month: [f for f in figures if f.account in covered] for month, figures in usage.items()}
        used, unpriced_used = used_figures(budget.unit, mine, chargeback)
        committed, unpriced_committed = committed_figures(
            budget.unit, [r for r in running if r.account in covered], period, at, zone, chargeback
        )
        rows.append(
            budget_row(
                budget,
                period,
                at,
                used,
                committed,
                unpriced_used + unpriced_committed,
                covered,
                chargeback.currency,
            )
        )
    return rows


def cmd_report_budget(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.budget import COLUMNS, configured_budgets, merge_budgets, slurm_budgets

    scope = scope_for(
        config, Action.VIEW_AGGREGATES, common.current_identity(config)
    )  # looked up at call time
    ctx = open_context(config)
    now = ctx.clock()
    at = now
    if args.at:
        try:
            at = parse_slurm_time(args.at, now=now, zone=config.zone)
        except ValueError as exc:
            raise ConfigError(f"--at: {exc}") from exc
    chargeback = config.chargeback
    budgets = configured_budgets(chargeback, at, config.zone)
    if chargeback.budgets_from_slurm:
        budgets = merge_budgets(
            budgets, slurm_budgets(read_slurm_budgets(config), chargeback.budget_slurm_period)
        )
    wanted = set(split_list(args.accounts))
    visible = [b for b in budgets if scope.everything or b.account in scope.accounts]
    if wanted:
        # an account with a budget but no job yet is known; the check runs in the caller's scope
        with ctx.engine.connect() as conn:
            warn_unknown(
                conn,
                scope,
                JobFilter(accounts=split_list(args.accounts)),
                also_known={"account": {b.account for b in visible}},
            )
    budgets = [b for b in visible if not wanted or b.account in wanted]
    rows: list[BudgetRow] = []
    if budgets:
        parents = read_account_parents(config)
        with ctx.engine.connect() as conn:
            rows = budget_rows(conn, config, budgets, parents, at, scope)
    unpriced = sum(r.unpriced_gpu_hours for r in rows)
    if unpriced:
        warn(f"{unpriced} GPU-hours of money budgets match no [[chargeback.rates]] entry: not counted")
    if not rows:
        log.info("no budgets to show (none configured or visible to you)")
    title = f"Budgets at {at.astimezone(config.zone).isoformat()} ({config.site.timezone})"
    render([r.record() for r in rows], sys.stdout, args.format, columns=COLUMNS, title=title)
    return EXIT_OK
