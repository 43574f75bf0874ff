"""`slurmtel report budget`: per account and period, budget, used, committed, remaining and
the projected date of exhaustion (docs/chargeback.md "Budgets").

Access: VIEW_AGGREGATES. Rows are the budgets of accounts in the caller's scope (admins and
finance: all; a coordinator: the accounts they coordinate and their sub-accounts).
"""

from __future__ import annotations

import argparse
import logging
from datetime import datetime
from typing import TYPE_CHECKING

from slurmtel.access import EVERYTHING, Action, Scope
from slurmtel.budget import COLUMNS as BUDGET_COLUMNS
from slurmtel.commands.common import account_tree, add_format_argument, split_list, unknown_filter_warnings
from slurmtel.commands.views import Connect, Document, View, ViewRequest, document, run_cli, scope_of, section
from slurmtel.config import Config
from slurmtel.errors import ConfigError, ParseError, SourceUnavailable
from slurmtel.filters import JobFilter
from slurmtel.reports.render import local_time
from slurmtel.reports.spec import Parameter
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
    # through slurmtel serve on a login node (api.url), as every report
    budget.set_defaults(handler=cmd_report_budget, through_api=True)


def read_slurm_budgets(config: Config, warnings: list[str]) -> dict[str, int]:
    """Accounts' GrpTRESMins gres/gpu from sacctmgr; {} (with a warning) when it cannot say."""
    from slurmtel.parsers.sacctmgr import GRP_TRES_MINS_ARGS, parse_grp_tres_mins

    command = config.access.sacctmgr_command
    if not command:
        warnings.append(
            "chargeback.budgets_from_slurm is on but access.sacctmgr_command is empty: configured budgets only"
        )
        return {}
    try:
        raw = run_command([command, *GRP_TRES_MINS_ARGS], timeout_seconds=30)
        return parse_grp_tres_mins(raw.decode("utf-8", "replace"))
    except (SourceUnavailable, ParseError) as exc:
        warnings.append(f"cannot read GrpTRESMins from sacctmgr ({exc}): configured budgets only")
        return {}


def read_account_parents(config: Config, warnings: list[str]) -> dict[str, frozenset[str]] | None:
    """The account tree, or None (with a warning) when it cannot be read."""
    try:
        return account_tree(config)
    except (SourceUnavailable, ParseError) as exc:
        warnings.append(
            f"cannot read the account tree from sacctmgr ({exc}): budgets cover only their own account"
        )
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
    request = {"job_filter": JobFilter(accounts=split_list(args.accounts)), "options": {"at": args.at}}
    return run_cli(VIEW, config, request, args.format)


def budget_document(config: Config, request: ViewRequest, connect: Connect) -> Document:
    """`report budget` for REQUEST: a row per budget the caller may see, at --at (default now)."""
    from slurmtel.budget import COLUMNS, KEY_COLUMNS, configured_budgets, merge_budgets, slurm_budgets

    # --at is checked before a database is opened (or an embedded one started)
    at = request.now
    if request.option("at"):
        try:
            at = parse_slurm_time(request.option("at"), now=request.now, zone=config.zone)
        except ValueError as exc:
            raise ConfigError(f"--at: {exc}") from exc
    scope = scope_of(request.identity, Action.VIEW_AGGREGATES)
    warnings: list[str] = []
    chargeback = config.chargeback
    budgets = configured_budgets(chargeback, at, config.zone)
    if chargeback.budgets_from_slurm:
        budgets = merge_budgets(
            budgets, slurm_budgets(read_slurm_budgets(config, warnings), chargeback.budget_slurm_period)
        )
    accounts = request.job_filter.accounts
    visible = [b for b in budgets if scope.everything or b.account in scope.accounts]
    budgets = [b for b in visible if not accounts or b.account in accounts]
    rows: list[BudgetRow] = []
    parents = read_account_parents(config, warnings) if budgets else None
    with connect(scope) as conn:
        if accounts:
            # an account with a budget but no job yet is known; the check runs in the caller's scope
            warnings += unknown_filter_warnings(
                conn, scope, request.job_filter, also_known={"account": {b.account for b in visible}}
            )
        if budgets:
            rows = budget_rows(conn, config, budgets, parents, at, scope)
    unpriced = sum(r.unpriced_gpu_hours for r in rows)
    if unpriced:
        warnings.append(
            f"{unpriced} GPU-hours of money budgets match no [[chargeback.rates]] entry: not counted"
        )
    if not rows:
        log.info("no budgets to show (none configured or visible to you)")
    table = section(
        "budget",
        f"Budgets at {local_time(at, config.zone)}",
        [r.record() for r in rows],
        COLUMNS,
        key_columns=KEY_COLUMNS,
    )
    return document("budget", [table], now=request.now, warnings=warnings, single=True)


VIEW = View(
    name="budget",
    help="budgets per account and period: used, committed, remaining, projected exhaustion",
    action=Action.VIEW_AGGREGATES,
    build=budget_document,
    sections=(("budget", BUDGET_COLUMNS),),
    parameters=(
        Parameter("at", str, None, "the moment to report at (sacct time forms, site.timezone; default now)"),
    ),
    window=False,
    filters=("accounts",),
)
