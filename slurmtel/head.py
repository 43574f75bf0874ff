"""The `slurmtel` command's entry point: the head's CLI, or a plain word when the head's
packages are not installed.

A GPU node installs only what the agent needs (`pip install 'slurmtel[nvml]'`: the base
dependencies and nvidia-ml-py); the head's CLI also needs the `head` extra (SQLAlchemy,
psycopg, alembic, APScheduler, pgserver, matplotlib, rich, python-hostlist, starlette, uvicorn
and the h11 and anyio they bring). Run without it,
`slurmtel` says which package is missing and how to install it instead of a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# the importable names of the `head` extra's packages (pyproject.toml)
HEAD_MODULES = frozenset(
    {
        "sqlalchemy",
        "psycopg",
        "alembic",
        "apscheduler",
        "pgserver",
        "matplotlib",
        "rich",
        "hostlist",
        "starlette",
        "uvicorn",
        "jinja2",
        "markupsafe",
        "h11",
        "anyio",
    }
)
EXIT_MISSING = 1


def missing_head_package(exc: ModuleNotFoundError) -> str | None:
    """The head package EXC says is missing, or None when it is some other module."""
    top = (exc.name or "").split(".")[0]
    return top if top in HEAD_MODULES else None


def _refuse(package: str) -> int:
    print(
        f"slurmtel: the head's packages are not installed (no module named '{package}'); "
        "install slurmtel[head] (pip install 'slurmtel[head]', or pip install '.[head]' from a "
        "checkout). A GPU node needs only slurmtel-agent: pip install 'slurmtel[nvml]'.",
        file=sys.stderr,
    )
    return EXIT_MISSING


def first_missing_head_package() -> str | None:
    """A head package that is not installed, found without importing any: the CLI imports
    the database stack only in the commands that use it, so a missing one would otherwise
    show only when such a command runs, after `--help` had answered as if all were there."""
    from importlib.util import find_spec

    for name in sorted(HEAD_MODULES):
        try:
            if find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def main(argv: Sequence[str] | None = None) -> int:
    package = first_missing_head_package()
    if package is not None:
        return _refuse(package)
    try:
        from slurmtel.cli import main as cli_main

        return cli_main(argv)
    except ModuleNotFoundError as exc:
        package = missing_head_package(exc)
        if package is None:
            raise
        return _refuse(package)
