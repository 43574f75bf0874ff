"""The CLI's commands: one module per group, each with `register(commands, reports)`.

`commands` is the top-level subcommand group, `reports` the one under `slurmtel report`.
"""

from __future__ import annotations

from slurmtel.commands import (
    admin_reports,
    budget,
    collect,
    cost,
    daemon,
    db,
    demo,
    fabric,
    finance,
    operations,
    researcher,
    usage,
)

COMMAND_MODULES = (
    collect,
    db,
    usage,
    operations,
    demo,
    researcher,
    finance,
    admin_reports,
    budget,
    cost,
    fabric,
    daemon,
)
