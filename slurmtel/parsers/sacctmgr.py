"""sacctmgr output: who coordinates which accounts, and the account tree.

`sacctmgr -n -P show user withcoord format=User,Coordinators` and
`sacctmgr -P show account withassoc` (read by its header, so column order does not matter).
"""

from __future__ import annotations

from collections.abc import Iterable

from slurmtel.errors import ParseError

COORDINATORS_ARGS = ("-n", "-P", "show", "user", "withcoord", "format=User,Coordinators")
ACCOUNT_TREE_ARGS = ("-P", "show", "account", "withassoc")


def parse_coordinators(raw: str) -> dict[str, frozenset[str]]:
    """user -> the accounts they coordinate (users who coordinate none are left out)."""
    result: dict[str, frozenset[str]] = {}
    for line in raw.splitlines():
        user, sep, accounts = line.partition("|")
        names = frozenset(a.strip() for a in accounts.split(",") if a.strip())
        if sep and user.strip() and names:
            result[user.strip()] = names
    return result


def parse_account_parents(raw: str) -> dict[str, frozenset[str]]:
    """account -> its parent accounts, from the account associations (rows without a user).

    An account normally has one parent; one per cluster where clusters differ, hence a set.
    """
    lines = raw.splitlines()
    if not lines:
        return {}
    header = lines[0].split("|")
    try:
        account_at, parent_at, user_at = (header.index(name) for name in ("Account", "ParentName", "User"))
    except ValueError:
        raise ParseError(
            f"sacctmgr show account withassoc: no Account, ParentName and User columns in {lines[0]!r}"
        ) from None
    parents: dict[str, set[str]] = {}
    for line in lines[1:]:
        fields = line.split("|")
        if len(fields) < len(header):
            continue
        account, parent, user = fields[account_at].strip(), fields[parent_at].strip(), fields[user_at].strip()
        if account and parent and not user:
            parents.setdefault(account, set()).add(parent)
    return {account: frozenset(p) for account, p in parents.items()}


def with_sub_accounts(accounts: Iterable[str], parents: dict[str, frozenset[str]]) -> frozenset[str]:
    """ACCOUNTS and every account below them in the tree (a coordinator's reach in Slurm)."""
    children: dict[str, set[str]] = {}
    for account, account_parents in parents.items():
        for parent in account_parents:
            children.setdefault(parent, set()).add(account)
    reach = set(accounts)
    todo = list(reach)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in reach:
                reach.add(child)
                todo.append(child)
    return frozenset(reach)
