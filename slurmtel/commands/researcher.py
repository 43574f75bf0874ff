"""`slurmtel job JOBID` and `slurmtel me`: a researcher's own jobs and month (DESIGN §7).

The documents and their text come from slurmtel.reports.researcher; with `[api] url` in the
config (a login node) they come from `slurmtel serve` instead, which decides the caller's scope
(slurmtel.api.client).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from slurmtel.commands import common
from slurmtel.commands.argtypes import positive_int
from slurmtel.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    add_wide_argument,
    open_reader,
    split_list,
)
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.filters import JobFilter
from slurmtel.reports.researcher import (
    JOB_FORMATS,
    ME_FORMATS,
    job_document,
    job_plot,
    job_query,
    me_document,
    me_query,
    write_job,
    write_me,
)

if TYPE_CHECKING:
    from slurmtel.store.samples import SampleStore


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    job = commands.add_parser("job", help="how one job used its GPUs, with advice (like jobstats)")
    job.add_argument("jobid", metavar="JOBID", help="job id: 123, array task 10_4, het component 123+1")
    job.add_argument("-M", "--clusters", default=None, help="comma-separated clusters")
    job.add_argument("--format", choices=JOB_FORMATS, default="table", help="output format (default table)")
    add_wide_argument(job)
    job.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="also draw GPU utilisation, memory and power over time into FILE.png, FILE.svg or FILE.pdf",
    )
    job.set_defaults(handler=cmd_job, through_api=True)

    me = commands.add_parser("me", help="your GPU-hours, idle share, failures and top jobs this month")
    me.add_argument("--month", default=None, metavar="YYYY-MM", help="default: this month (site.timezone)")
    me.add_argument(
        "-u", "--user", default=None, help="another user (admins; coordinators for their accounts)"
    )
    me.add_argument(
        "--top", type=positive_int, default=10, help="how many top jobs to list (default 10; 1 or more)"
    )
    me.add_argument(
        "--jobs",
        action="store_true",
        help="list every job attempt of the month instead: GPU use, CPU efficiency, peak memory",
    )
    me.add_argument(
        "--format", choices=ME_FORMATS, default="table", help="output format (default table; csv with --jobs)"
    )
    add_wide_argument(me)
    me.set_defaults(handler=cmd_me, through_api=True)


def cmd_job(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.commands.argtypes import check_job_id, plot_format

    # a bad job id or --plot file is said before any work is done (exit 2, or 1 for the folder)
    check_job_id(args.jobid)
    fmt = plot_format(args.plot) if args.plot is not None else None
    clusters = split_list(args.clusters)
    if config.api.url:
        from slurmtel.api.client import ApiClient

        client = ApiClient(config)
        reports = client.job(args.jobid, clusters)
        plot = client.job_plot(args.jobid, clusters, fmt) if fmt and reports else None
    else:
        identity = common.current_identity(config)  # looked up at call time (tests replace it)
        with open_reader(config) as (conn, now):
            query = job_query(
                identity,
                args.jobid,
                clusters=clusters,
                now=now,
                zone=config.zone,
                pricing=config.chargeback,
                samples=_remote_samples(config),
                causes=config.idle_causes,
            )
            reports = job_document(conn, query)
            plot = job_plot(conn, query, fmt) if fmt and reports else None
    if not reports:
        # the same answer for a job outside the caller's scope: existence is not disclosed
        print(f"slurmtel: job {args.jobid} not found", file=sys.stderr)
        return EXIT_ERROR
    write_job(reports, sys.stdout, args.format, config.zone)
    if plot is not None:
        data, has_points = plot
        Path(args.plot).write_bytes(data)
        if not has_points:
            print(f"slurmtel: no GPU telemetry for job {args.jobid}: the plot is empty", file=sys.stderr)
        print(f"slurmtel: wrote {args.plot}", file=sys.stderr)
    return EXIT_OK


def cmd_me(args: argparse.Namespace, config: Config) -> int:
    if args.format == "csv" and not args.jobs:
        raise ConfigError("--format csv needs --jobs (the month's summary is a table or json)")
    if config.api.url:
        from slurmtel.api.client import ApiClient

        document = ApiClient(config).me(user=args.user, month=args.month, jobs=args.jobs, top=args.top)
        # the server's warn_unknown for -u, in the caller's scope (an older server sends none)
        for line in document.pop("warnings", None) or ():
            common.warn(line)
        write_me(document, sys.stdout, args.format)
        return EXIT_OK
    identity = common.current_identity(config)  # looked up at call time (tests replace it)
    # --month is checked before a database is opened (or an embedded one started)
    query = me_query(
        identity,
        user=args.user,
        month=args.month,
        now=common.site_now(config),
        zone=config.zone,
        jobs=args.jobs,
        top=args.top,
        pricing=config.chargeback,
    )
    with open_reader(config) as (conn, _):
        if args.user:
            common.warn_unknown(conn, query.scope, JobFilter(users=(query.user,)))
        document = me_document(conn, query)
    write_me(document, sys.stdout, args.format)
    return EXIT_OK


def _remote_samples(config: Config) -> SampleStore | None:
    """The sample store `job` reads windows through when they are kept outside PostgreSQL; None
    for PostgreSQL's (the read functions read its tables themselves), so that a command on the
    head node does not import what storing needs (SQLAlchemy: issue 12)."""
    if config.telemetry.sample_store == "postgresql":
        return None
    from slurmtel.store.samples import sample_store

    return sample_store(config)
