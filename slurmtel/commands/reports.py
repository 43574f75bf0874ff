"""`slurmtel report NAME` for every spec in slurmtel.reports.catalog.REPORTS: one handler.

The arguments come from the spec (window, filters, its Parameters, --format), the query from
reports.spec.build_query for the calling unix user, the rows from reports.spec.run_report.
A report with one section prints a table, a CSV or a JSON list; one with several prints a titled
table each, a JSON object {"section": [rows], ...}, or CSV blocks under "# section".
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from slurmtel.commands import common
from slurmtel.commands.argtypes import positive_int
from slurmtel.commands.common import (
    EXIT_OK,
    add_filter_arguments,
    add_format_argument,
    add_window_arguments,
    job_filter,
    open_reader,
    resolve_window,
    warn_unknown,
)
from slurmtel.commands.sections import write_report
from slurmtel.config import Config
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.spec import Parameter, ReportSpec, build_query, report_document, run_report


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    for spec in REPORTS.values():
        parser: argparse.ArgumentParser = reports.add_parser(spec.name, help=spec.help)
        add_window_arguments(parser)
        add_filter_arguments(parser)
        for parameter in spec.parameters:
            _add_parameter(parser, parameter)
        add_format_argument(parser)
        # through slurmtel serve on a login node (api.url)
        parser.set_defaults(handler=functools.partial(cmd_report, spec), through_api=True)
    # `report nodes --drift` is the fabric plane's drift report under the nodes name
    nodes = reports.choices["nodes"]
    nodes.add_argument(
        "--drift",
        action="store_true",
        help="instead: the nodes that differ from the majority of their partition (driver, CUDA, "
        "VBIOS, GPU model, GPU memory, GPUs, topology), with since when",
    )
    nodes.set_defaults(handler=cmd_report_nodes, through_api=True)


def _add_parameter(parser: argparse.ArgumentParser, p: Parameter) -> None:
    flag = f"--{p.name.replace('_', '-')}"
    if p.kind is bool:
        parser.add_argument(flag, dest=p.name, action="store_true", help=p.help)
        return
    kind: Any = positive_int if p.kind is int and p.minimum == 1 else p.kind
    parser.add_argument(
        flag,
        dest=p.name,
        type=kind,
        default=p.default,
        choices=p.choices or None,
        metavar=None if p.choices else "N" if p.kind in (int, float) else "TEXT",
        help=p.help,
    )


def cmd_report_nodes(args: argparse.Namespace, config: Config) -> int:
    if args.drift:
        from slurmtel.commands.fabric import cmd_report_drift

        return cmd_report_drift(args, config)
    return cmd_report(REPORTS["nodes"], args, config)


def cmd_report(spec: ReportSpec, args: argparse.Namespace, config: Config) -> int:
    wanted = job_filter(args)
    options = {p.name: getattr(args, p.name) for p in spec.parameters}
    if config.api.url:
        from slurmtel.api.client import ApiClient

        document = ApiClient(config).report(
            spec.name, start=args.start, end=args.end, job_filter=wanted, options=options
        )
        # the server's warn_unknown, in the caller's scope (an older server sends none)
        for line in document.pop("warnings", None) or ():
            common.warn(line)
        write_report(document, sys.stdout, args.format)
        return EXIT_OK
    identity = common.current_identity(config)
    # the window and the options are checked before a database is opened (or started)
    now = common.site_now(config)
    start, end = resolve_window(args, config, now)
    query = build_query(
        spec,
        identity,
        start=start,
        end=end,
        now=now,
        zone=config.zone,
        job_filter=wanted,
        options=options,
        resubmission_window_seconds=config.attribution.resubmission_window_seconds,
        poll_interval_seconds=config.sources.slurmctld.interval_seconds,
    )
    with open_reader(config) as (conn, _):
        warn_unknown(conn, query.scope, wanted)
        result = run_report(conn, spec, query)
    write_report(report_document(result), sys.stdout, args.format)
    return EXIT_OK
