"""sacctmgr output: who coordinates which accounts, and the account tree.

`sacctmgr -n -P show user withcoord format=User,Coordinators`,
`sacctmgr -P show account withassoc` (read by its header, so column order does not matter) and
`sacctmgr -n -P show assoc format=Cluster,Account,User,GrpTRESMins` (accounts' GPU-minute limits).
"""

from __future__ import annotations

from collections.abc import Iterable

from slurmtel.errors import ParseError

COORDINATORS_ARGS = ("-n", "-P", "show", "user", "withcoord", "format=User,Coordinators")
ACCOUNT_TREE_ARGS = ("-P", "show", "account", "withassoc")
GRP_TRES_MINS_ARGS = ("-n", "-P", "show", "assoc", "format=Cluster,Account,User,GrpTRESMins")


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


def parse_account_fields(raw: str) -> dict[str, tuple[str, str]]:
    """account -> (Organization, Description) from the account rows of `sacctmgr -P show account
    withassoc` (the first row of an account: they repeat per association)."""
    lines = raw.splitlines()
    if not lines:
        return {}
    header = lines[0].split("|")
    try:
        account_at, org_at, descr_at = (header.index(name) for name in ("Account", "Org", "Descr"))
    except ValueError:
        raise ParseError(
            f"sacctmgr show account withassoc: no Account, Org and Descr columns in {lines[0]!r}"
        ) from None
    fields: dict[str, tuple[str, str]] = {}
    for line in lines[1:]:
        parts = line.split("|")
        if len(parts) < len(header):
            continue
        account = parts[account_at].strip()
        if account:
            fields.setdefault(account, (parts[org_at].strip(), parts[descr_at].strip()))
    return fields


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


def parse_grp_tres_mins(raw: str) -> dict[str, int]:
    """account -> its GrpTRESMins gres/gpu (GPU-minutes), from the account associations (rows
    without a user) of `sacctmgr -n -P show assoc format=Cluster,Account,User,GrpTRESMins`.

    Only the untyped `gres/gpu` TRES counts (`gres/gpu:h100` limits are per model); accounts
    without one are left out. An account limited on several clusters gets the sum (its usage
    is summed over clusters too). User rows (a user's own limit) are not account budgets.
    """
    result: dict[str, int] = {}
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 4:
            raise ParseError(
                f"sacctmgr show assoc line {number}: want Cluster|Account|User|GrpTRESMins: {line!r}"
            )
        account, user, limits = fields[1].strip(), fields[2].strip(), fields[3].strip()
        if not account or user:
            continue
        for item in limits.split(","):
            name, sep, value = item.partition("=")
            if not sep or name.strip() != "gres/gpu":
                continue
            try:
                minutes = int(value.strip())
            except ValueError:
                raise ParseError(
                    f"sacctmgr show assoc line {number}: gres/gpu limit is not a number: {value!r}"
                ) from None
            if minutes >= 0:
                result[account] = result.get(account, 0) + minutes
    return result
