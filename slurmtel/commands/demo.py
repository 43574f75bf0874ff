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
        "a configured database), simulate a week of a small GPU cluster (generated data) and feed what its "
        "sacct (with job steps), scontrol and node agents would print through the real parsers and daemon "
        "jobs, with nccl-tests acceptance jobs whose StdOut is a real published log shipped with the "
        "package; then print every report, the researcher and finance views, write a chargeback CSV and a "
        "job's utilisation plot, and leave a config (<state_dir>/demo/slurmtel.toml: [cost], budgets) whose "
        "clock stands at the end of the week. The other commands read that config when given no other "
        "(no --config, $SLURMTEL_CONFIG or /etc/slurmtel/slurmtel.toml). It prints how long it took and "
        "what to type next. No Slurm, GPU or PostgreSQL needed.",
    )
    # the demo never reads a config it left itself: its home would be <state_dir>/demo/demo
    demo.set_defaults(handler=cmd_demo, finds_demo_config=False)


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.demo import run_demo

    return run_demo(config, sys.stdout, args.run_cli)
