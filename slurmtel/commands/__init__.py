"""The CLI's commands: one module per group, each with `register(commands, reports)`.

`commands` is the top-level subcommand group, `reports` the one under `slurmtel report`.
COMMAND_MODULES names every module with the top-level commands its register() adds ("report":
reports under `slurmtel report`), so that the CLI imports only the module of the command it
runs (tests/test_cli_start.py checks the names against what each register() adds).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# in the order `slurmtel --help` lists the commands
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "collect": ("collect",),
    "db": ("db",),
    "reports": ("report",),
    "operations": ("quarantine", "attribute", "runs"),
    "demo": ("demo",),
    "researcher": ("job", "me"),
    "finance": ("chargeback",),
    "budget": ("report",),
    "cost": ("report",),
    "fabric": ("report",),
    "idle_now": ("report",),
    "act": ("act", "mailprog"),
    "daemon": ("run", "check-config"),
    "serve": ("serve",),
}


def command_modules(command: str | None = None) -> list[ModuleType]:
    """The modules that register COMMAND; every one when COMMAND is None or not a command."""
    names = [name for name, commands in COMMAND_MODULES.items() if command in commands]
    return [importlib.import_module(f"{__name__}.{name}") for name in names or COMMAND_MODULES]
