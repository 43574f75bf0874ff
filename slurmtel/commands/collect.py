"""`slurmtel collect SOURCE --once | --input FILE`: one run of a source, recorded."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.clock import advance_clock, site_clock
from slurmtel.commands import common
from slurmtel.commands.argtypes import check_collect_arguments, usage_or_error
from slurmtel.commands.common import EXIT_OK, EXIT_PARTIAL, open_context
from slurmtel.config import Config
from slurmtel.sources import SOURCES, get_source

if TYPE_CHECKING:
    pass


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    collect = commands.add_parser("collect", help="run one source once, or ingest a saved capture")
    sources = collect.add_subparsers(title="sources", metavar="SOURCE", required=True)
    for source in SOURCES.values():
        sp = sources.add_parser(source.name, help=source.description)
        mode = sp.add_mutually_exclusive_group(required=True)
        mode.add_argument("--once", action="store_true", help="one collection cycle, as the daemon runs it")
        mode.add_argument("--input", type=Path, metavar="FILE", help="ingest a saved capture instead")
        source.add_arguments(sp)
        sp.set_defaults(handler=cmd_collect, source=source.name)


def cmd_collect(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.sources.runner import run_recorded

    source = get_source(args.source)
    # arguments first: a refused command changes nothing, not even a simulated clock, and
    # opens no database (starts no embedded one)
    check_collect_arguments(source, args, config, common.site_now(config))
    ctx = open_context(config)
    if args.input is None and source.enabled(config):
        # a simulated world's clock (the demo's site.clock file) moves on by the daemon's interval
        advance_clock(config, source.interval_seconds(config))
        ctx = dataclasses.replace(ctx, clock=site_clock(config, common.utc_now))
    if args.input is not None:
        path = args.input
        outcome = run_recorded(ctx, source.name, "input", lambda: source.ingest(ctx, path, args))
    else:
        outcome = run_recorded(ctx, source.name, "once", lambda: source.collect(ctx, args))
    for note in outcome.result.notes:
        print(note)
    if outcome.status == "error":
        print(f"slurmtel: {source.name}: {outcome.error_kind}: {outcome.message}", file=sys.stderr)
        # a bad argument or setting the source found (--input without --node) is a usage error
        return usage_or_error(outcome.error_kind)
    if outcome.status == "partial":
        print(f"slurmtel: {source.name}: {outcome.message} (see `slurmtel quarantine list`)", file=sys.stderr)
        return EXIT_PARTIAL
    return EXIT_OK
