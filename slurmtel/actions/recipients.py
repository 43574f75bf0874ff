"""Who a rule's message goes to: its `to` roles and addresses, as e-mail addresses.

- owner: the address Slurm gave `slurmtel mailprog` for the job (its --mail-user), else the
  user's address;
- coordinators: the account's sacctmgr coordinators (and, as in Slurm, those of an account
  above it), each at their user address; asked of sacctmgr once per evaluation;
- pis: [actions.recipients] pis for the account;
- admins, finance: [actions.recipients] admins and finance.

A user's address is [actions.recipients] users[user], else user@domain, else none (the
message is recorded without that recipient, and the reason says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from slurmtel.actions.settings import DEFAULT_TO, ActionRule, RecipientsConfig
from slurmtel.config import Config
from slurmtel.errors import ParseError, SourceUnavailable

log = logging.getLogger(__name__)

# (address, role): role "" for an address a rule names itself
Recipient = tuple[str, str]


def account_coordinators(config: Config) -> dict[str, frozenset[str]]:
    """account -> the users who coordinate it (directly or through an account above it)."""
    from slurmtel.parsers.sacctmgr import COORDINATORS_ARGS, parse_coordinators, with_sub_accounts
    from slurmtel.sources.io import run_command

    command = config.access.sacctmgr_command
    if not command:
        return {}
    try:
        raw = run_command([command, *COORDINATORS_ARGS], timeout_seconds=30)
    except SourceUnavailable as exc:
        log.warning("cannot ask sacctmgr for the coordinators (%s): no message goes to coordinators", exc)
        return {}
    by_user = parse_coordinators(raw.decode("utf-8", "replace"))
    parents: dict[str, frozenset[str]] | None
    if by_user:
        from slurmtel.commands.common import account_tree

        try:
            parents = account_tree(config)
        except (SourceUnavailable, ParseError) as exc:
            log.warning("cannot read the account tree from sacctmgr (%s): sub-accounts not included", exc)
            parents = None
    result: dict[str, set[str]] = {}
    for user, accounts in by_user.items():
        for account in with_sub_accounts(accounts, parents) if parents else accounts:
            result.setdefault(account, set()).add(user)
    return {account: frozenset(users) for account, users in result.items()}


class Recipients:
    """Resolves roles to addresses for one evaluation (coordinators are read once, when needed)."""

    def __init__(
        self, config: Config, coordinators: Callable[[], dict[str, frozenset[str]]] | None = None
    ) -> None:
        self.settings: RecipientsConfig = config.actions.recipients
        self._config = config
        self._lookup = coordinators or (lambda: account_coordinators(config))
        self._coordinators: dict[str, frozenset[str]] | None = None

    def user_address(self, user: str) -> str | None:
        if not user:
            return None
        if user in self.settings.users:
            return self.settings.users[user]
        if self.settings.domain:
            return f"{user}@{self.settings.domain}"
        return None

    def coordinators_of(self, account: str) -> frozenset[str]:
        if not self.settings.coordinators or not account:
            return frozenset()
        if self._coordinators is None:
            self._coordinators = self._lookup()
        return self._coordinators.get(account, frozenset())

    def resolve(
        self,
        rule: ActionRule,
        *,
        user: str = "",
        account: str = "",
        owner_address: str = "",
        roles: Sequence[str] | None = None,
    ) -> tuple[list[Recipient], list[str]]:
        """The addresses of ROLES (default: the rule's `to`, else its kind's default), each once
        with the first role that named it; and a note per role that gave nobody."""
        wanted = list(roles if roles is not None else (rule.to or DEFAULT_TO[rule.kind]))
        found: dict[str, str] = {}
        notes: list[str] = []

        def add(address: str | None, role: str) -> None:
            if address and address not in found:
                found[address] = role

        for target in wanted:
            if "@" in target:
                add(target, "")
            elif target == "owner":
                address = owner_address or self.user_address(user)
                if address is None:
                    notes.append(f"the owner {user or '(unknown)'} has no address (actions.recipients)")
                add(address, "owner")
            elif target == "coordinators":
                users = sorted(self.coordinators_of(account))
                for coordinator in users:
                    add(self.user_address(coordinator), "coordinators")
                if not users:
                    notes.append(f"account {account or '(none)'} has no coordinator in sacctmgr")
            elif target == "pis":
                addresses = self.settings.pis.get(account, [])
                for address in addresses:
                    add(address, "pis")
                if not addresses:
                    notes.append(f"account {account or '(none)'} has no PI in actions.recipients.pis")
            elif target in ("admins", "finance"):
                addresses = getattr(self.settings, target)
                for address in addresses:
                    add(address, target)
                if not addresses:
                    notes.append(f"actions.recipients.{target} is empty")
        return sorted(found.items(), key=lambda item: (item[1] != "owner", item[0])), notes
