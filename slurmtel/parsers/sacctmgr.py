"""`sacctmgr -n -P show user withcoord format=User,Coordinators`: who coordinates which accounts."""

from __future__ import annotations

COORDINATORS_ARGS = ("-n", "-P", "show", "user", "withcoord", "format=User,Coordinators")


def parse_coordinators(raw: str) -> dict[str, frozenset[str]]:
    """user -> the accounts they coordinate (users who coordinate none are left out)."""
    result: dict[str, frozenset[str]] = {}
    for line in raw.splitlines():
        user, sep, accounts = line.partition("|")
        names = frozenset(a.strip() for a in accounts.split(",") if a.strip())
        if sep and user.strip() and names:
            result[user.strip()] = names
    return result
