"""`slurmtel demo`: the first command a new user runs."""

from __future__ import annotations

import argparse
import sys

from slurmtel.config import Config


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="ingest the bundled real Slurm capture into an embedded database of its own and show a report",
    )
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.demo import run_demo

    return run_demo(config, sys.stdout)
