"""What a ledger import needs on each statement line: the account's PI, cost centre and grant
or GL code (issue 27 item 3).

An account's codes, field by field: its [[chargeback.accounts]] entry; else what sacctmgr's
Organization and Description hold for it (chargeback.sacctmgr_organization and
chargeback.sacctmgr_description say which field each is); else its parent's, up the Slurm
account tree (sub-accounts roll up to their PI, as Slurm's own limits roll up). A line carries
the codes as they were when its statement was made: a closed statement keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace

from slurmtel.config import LEDGER_FIELDS, ChargebackConfig, Config
from slurmtel.errors import ChargebackError, SlurmtelError
from slurmtel.rows import StatementLine


@dataclass(frozen=True)
class LedgerCodes:
    pi: str = ""
    cost_centre: str = ""
    gl_code: str = ""

    def merged(self, fallback: LedgerCodes) -> LedgerCodes:
        """These codes, each empty one taken from FALLBACK."""
        return LedgerCodes(**{name: getattr(self, name) or getattr(fallback, name) for name in LEDGER_FIELDS})


@dataclass(frozen=True)
class Ledger:
    """Each account's own codes and the account tree they are inherited through."""

    own: Mapping[str, LedgerCodes]
    parents: Mapping[str, frozenset[str]]

    def codes(self, account: str) -> LedgerCodes:
        codes = LedgerCodes()
        seen: set[str] = set()
        current: str | None = account
        while current is not None and current not in seen:
            seen.add(current)
            codes = codes.merged(self.own.get(current, LedgerCodes()))
            up = sorted(self.parents.get(current, ()))
            current = up[0] if up and up[0] != "root" else None
        return codes


NO_LEDGER = Ledger({}, {})


def ledger_of(config: ChargebackConfig, withassoc: str | None = None) -> Ledger:
    """The ledger of CONFIG's [[chargeback.accounts]] and, from WITHASSOC (the output of
    `sacctmgr -P show account withassoc`), the account tree and the Organization/Description
    fields the config maps."""
    from slurmtel.parsers.sacctmgr import parse_account_fields, parse_account_parents

    own: dict[str, LedgerCodes] = {}
    parents: dict[str, frozenset[str]] = {}
    if withassoc is not None:
        parents = parse_account_parents(withassoc)
        for account, (organization, description) in parse_account_fields(withassoc).items():
            values = {}
            if config.sacctmgr_organization:
                values[config.sacctmgr_organization] = organization
            if config.sacctmgr_description:
                values[config.sacctmgr_description] = description
            if any(values.values()):
                own[account] = LedgerCodes(**values)
    for entry in config.accounts:
        configured = LedgerCodes(
            pi=entry.pi.strip(), cost_centre=entry.cost_centre.strip(), gl_code=entry.gl_code.strip()
        )
        own[entry.account] = configured.merged(own.get(entry.account, LedgerCodes()))
    return Ledger(own, parents)


def load_ledger(config: Config) -> Ledger:
    """The site's ledger: sacctmgr is asked (access.sacctmgr_command) when a field is mapped
    from it, or when there are entries whose sub-accounts may inherit them."""
    from slurmtel.parsers.sacctmgr import ACCOUNT_TREE_ARGS
    from slurmtel.sources.io import run_command

    chargeback = config.chargeback
    mapped = bool(chargeback.sacctmgr_organization or chargeback.sacctmgr_description)
    if not mapped and not chargeback.accounts:
        return NO_LEDGER
    command = config.access.sacctmgr_command
    if not command:
        if mapped:
            raise ChargebackError(
                "chargeback.sacctmgr_organization/sacctmgr_description read sacctmgr: "
                "access.sacctmgr_command is empty"
            )
        return ledger_of(chargeback)
    try:
        raw = run_command([command, *ACCOUNT_TREE_ARGS], timeout_seconds=30)
    except SlurmtelError as exc:
        raise ChargebackError(f"the accounts' ledger codes need sacctmgr: {exc}") from None
    return ledger_of(chargeback, raw.decode("utf-8", "replace"))


def with_codes(lines: Iterable[StatementLine], ledger: Ledger) -> tuple[StatementLine, ...]:
    """LINES, each with its account's ledger codes."""
    return tuple(replace(line, **asdict(ledger.codes(line.account))) for line in lines)
