"""`slurmtel demo`: the first command a new user runs."""

from __future__ import annotations

import argparse
import sys

from slurmtel.config import Config


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="simulate a week of a small GPU cluster into an embedded database of its own and show the reports",
        description="Start an embedded PostgreSQL of its own (<state_dir>/demo, emptied on every run, never "
        "a configured database), simulate a week of a small GPU cluster (generated data, no real capture) "
        "and feed what its sacct, scontrol and node agents would print through the real parsers and daemon "
        "jobs; then print the admin, researcher and finance views, write a chargeback CSV and a job's "
        "utilisation plot, and leave a config (<state_dir>/demo/slurmtel.toml) whose clock stands at the "
        "end of the week, so the commands can be tried afterwards. No Slurm, GPU or PostgreSQL needed.",
    )
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.demo import run_demo

    return run_demo(config, sys.stdout, args.run_cli)
