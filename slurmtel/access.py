"""Who may see what: the one place that decides (DESIGN §8).

Mirrors Slurm: a user sees their own jobs, an account coordinator the accounts they
coordinate, admins everything, finance aggregates and statements. Every report query takes a
`Scope`; there is no query without one. Deny by default: an unknown identity sees nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Role(Enum):
    ADMIN = "admin"
    FINANCE = "finance"
    USER = "user"
    NOBODY = "nobody"


class Action(Enum):
    # per-job detail: job ids, names, per-GPU samples
    VIEW_JOBS = "view_jobs"
    # aggregates by account/user/partition/node
    VIEW_AGGREGATES = "view_aggregates"
    # chargeback statements, closing a month
    VIEW_STATEMENTS = "view_statements"
    CLOSE_STATEMENTS = "close_statements"
    # cluster-wide operational views: nodes, queue, capacity, quarantine, runs
    VIEW_OPERATIONS = "view_operations"
    # the record of messages and actions (a user's: those about their own jobs)
    VIEW_ACTIONS = "view_actions"
    # running the action rules by hand, the exclusion list
    MANAGE_ACTIONS = "manage_actions"


@dataclass(frozen=True)
class Identity:
    user: str
    role: Role
    # accounts this user coordinates (sacctmgr coordinators)
    coordinated_accounts: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Scope:
    """The rows a query may return. `everything` or the union of own user and accounts."""

    everything: bool = False
    users: frozenset[str] = field(default_factory=frozenset)
    accounts: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_empty(self) -> bool:
        return not self.everything and not self.users and not self.accounts

    def sql_params(self) -> dict[str, object]:
        """Bind parameters for the database function slurmtel_in_scope (the same test in every query)."""
        return {
            "scope_all": self.everything,
            "scope_users": sorted(self.users),
            "scope_accounts": sorted(self.accounts),
        }


NOTHING = Scope()
EVERYTHING = Scope(everything=True)

_ROLE_ACTIONS: dict[Role, frozenset[Action]] = {
    Role.ADMIN: frozenset(Action),
    Role.FINANCE: frozenset({Action.VIEW_AGGREGATES, Action.VIEW_STATEMENTS, Action.CLOSE_STATEMENTS}),
    Role.USER: frozenset({Action.VIEW_JOBS, Action.VIEW_AGGREGATES, Action.VIEW_ACTIONS}),
    Role.NOBODY: frozenset(),
}


def allowed(identity: Identity, action: Action) -> Scope:
    """The scope IDENTITY has for ACTION; NOTHING when it may not act at all."""
    if action not in _ROLE_ACTIONS[identity.role]:
        return NOTHING
    if identity.role in (Role.ADMIN, Role.FINANCE):
        return EVERYTHING
    return Scope(users=frozenset({identity.user}), accounts=identity.coordinated_accounts)
