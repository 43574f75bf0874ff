"""The CLI's commands: one module per group, each with `register(commands, reports)`.

`commands` is the top-level subcommand group, `reports` the one under `slurmtel report`.
COMMAND_MODULES names every module with the top-level commands its register() adds ("report":
reports under `slurmtel report`), so that the CLI imports only the module of the command it
runs (tests/test_cli_start.py checks the names against what each register() adds), and
REPORT_MODULES the reports other than the catalog's, so that `report NAME` imports one.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# the command's exit status (slurmtel.cli): here, where the CLI finds them without importing
# what the commands share (slurmtel.commands.common re-exports them)
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3

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


# the reports under `slurmtel report` that a module other than "reports" registers; "reports"
# registers the catalog's (slurmtel.reports.catalog), every other name
REPORT_MODULES: dict[str, tuple[str, ...]] = {
    "budget": ("budget",),
    "cost": ("cost",),
    "fabric": ("fabric",),
    "idle_now": ("idle-now",),
}


def command_modules(command: str | None = None, report: str | None = None) -> list[ModuleType]:
    """The modules that register COMMAND; every one when COMMAND is None or not a command. For
    `report REPORT`, the one module that registers REPORT (the catalog's for a name no other
    module lists)."""
    names = [name for name, commands in COMMAND_MODULES.items() if command in commands]
    if command == "report" and report is not None:
        names = [name for name, reports in REPORT_MODULES.items() if report in reports] or ["reports"]
    return [importlib.import_module(f"{__name__}.{name}") for name in names or COMMAND_MODULES]
