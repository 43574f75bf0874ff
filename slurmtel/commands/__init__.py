"""The CLI's commands: one module per group, each with `register(commands, reports)`.

`commands` is the top-level subcommand group, `reports` the one under `slurmtel report`.
"""

from __future__ import annotations

from slurmtel.commands import (
    budget,
    collect,
    cost,
    daemon,
    db,
    demo,
    fabric,
    finance,
    operations,
    reports,
    researcher,
    serve,
)

COMMAND_MODULES = (
    collect,
    db,
    reports,
    operations,
    demo,
    researcher,
    finance,
    budget,
    cost,
    fabric,
    daemon,
    serve,
)
