"""What a report or view is narrowed to: the Slurm-style filters (-A, -u, -r, -M), the
outcome classes a job ends in and the forms of a job id. Plain values, no database: the CLI builds its arguments from
them without loading the store (slurmtel.store.usage re-exports both)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# "123", array task "10_4", heterogeneous job component "123+1"
JOB_ID = re.compile(r"\d+(?:[_+]\d+)?")

OUTCOME_CLASSES = (
    "completed",
    "user_failure",
    "system_failure",
    "cancelled",
    "preempted",
    "running",
    "unknown",
)


@dataclass(frozen=True)
class JobFilter:
    """Slurm-style filters (-A, -u, -r, -M); empty means no restriction."""

    accounts: Sequence[str] = field(default_factory=tuple)
    users: Sequence[str] = field(default_factory=tuple)
    partitions: Sequence[str] = field(default_factory=tuple)
    clusters: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # the CLI's and the API's filters alike: a NUL or control character, a name or a list
        # longer than any Slurm has, is a usage error here (ConfigError), not a database error
        from slurmtel.bounds import check_names

        for name, flag in (("accounts", "-A"), ("users", "-u"), ("partitions", "-r"), ("clusters", "-M")):
            check_names(getattr(self, name), f"{flag}/{name}")

    def sql_params(self) -> dict[str, Any]:
        return {
            "f_accounts": list(self.accounts),
            "f_users": list(self.users),
            "f_partitions": list(self.partitions),
            "f_clusters": list(self.clusters),
        }
