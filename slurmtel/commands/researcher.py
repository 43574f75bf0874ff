"""`slurmtel job JOBID` and `slurmtel me`: a researcher's own jobs and month (DESIGN §7).

Scope mirrors Slurm (slurmtel.access): a user sees their own jobs, a coordinator their
accounts' jobs, admins everything. A job outside the caller's scope is reported exactly like a
job that does not exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, TextIO

from slurmtel.access import Action
from slurmtel.commands import common
from slurmtel.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    AccessDenied,
    open_context,
    scope_for,
    split_list,
)
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.advice import GpuFigures, JobFacts, advise
from slurmtel.reports.render import render
from slurmtel.store.jobview import AttemptView
from slurmtel.timeparse import month_bounds

GIB = 2**30
JOB_FORMATS = ("table", "json")
TOP_COLUMNS = (
    "cluster",
    "job_id",
    "name",
    "account",
    "state",
    "attempts",
    "gpus",
    "gpu_hours",
    "idle_percent",
    "mean_util_percent",
    "coverage_percent",
)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    job = commands.add_parser("job", help="how one job used its GPUs, with advice (like jobstats)")
    job.add_argument("jobid", metavar="JOBID", help="job id: 123, array task 10_4, het component 123+1")
    job.add_argument("-M", "--clusters", default=None, help="comma-separated clusters")
    job.add_argument("--format", choices=JOB_FORMATS, default="table", help="output format (default table)")
    job.add_argument("--plot", type=Path, metavar="FILE.png", help="also draw GPU utilisation over time")
    job.set_defaults(handler=cmd_job)

    me = commands.add_parser("me", help="your GPU-hours, idle share, failures and top jobs this month")
    me.add_argument("--month", default=None, metavar="YYYY-MM", help="default: this month (site.timezone)")
    me.add_argument(
        "-u", "--user", default=None, help="another user (admins; coordinators for their accounts)"
    )
    me.add_argument("--top", type=int, default=10, help="how many top jobs to list (default 10)")
    me.add_argument("--format", choices=JOB_FORMATS, default="table", help="output format (default table)")
    me.set_defaults(handler=cmd_me)


# ------------------------------------------------------------------------------------ job


def _duration(seconds: float | None) -> str:
    """Slurm's [D-]HH:MM:SS."""
    if seconds is None:
        return ""
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def _local(moment: datetime | None, zone: tzinfo) -> str:
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z") if moment else ""


def _share(numerator: float, denominator: float) -> float | None:
    return round(100 * numerator / denominator, 1) if denominator > 0 else None


def energy_text(joules: float | None) -> str:
    """Energy in kWh from 1 kWh on, else Wh."""
    if joules is None:
        return ""
    wh = joules / 3600
    return f"{wh / 1000:.2f} kWh" if wh >= 1000 else f"{wh:.1f} Wh"


def gpu_row(g: GpuFigures) -> dict[str, Any]:
    """The figures of one GPU as shown (percentages with one decimal)."""
    mean = g.mean_util_percent
    return {
        "gpu_uuid": g.gpu_uuid or "(unmapped)",
        "node": g.node,
        "mapping": g.mapping,
        "allocated_hours": round(g.allocated_seconds / 3600, 4),
        "mean_util_percent": None if mean is None else round(mean, 1),
        "max_util_percent": None if g.util_max_percent is None else round(g.util_max_percent, 1),
        "idle_percent": _share(g.idle_seconds, g.covered_seconds),
        "coverage_percent": _share(g.covered_seconds, g.allocated_seconds),
        "max_memory_gib": None
        if g.memory_used_max_bytes is None
        else round(g.memory_used_max_bytes / GIB, 2),
        "memory_total_gib": None if not g.memory_total_bytes else round(g.memory_total_bytes / GIB, 1),
        "energy_joules": None if g.energy_joules is None else round(g.energy_joules, 1),
        "energy": energy_text(g.energy_joules),
    }


def attempt_report(
    attempt: AttemptView, gpus: Sequence[GpuFigures], now: datetime, zone: tzinfo
) -> dict[str, Any]:
    """One attempt's header, per-GPU figures and advice."""
    end = attempt.end_at or now
    elapsed = (end - attempt.start_at).total_seconds() if attempt.start_at else None
    wait = None
    if attempt.start_at and attempt.eligible_at and attempt.start_at >= attempt.eligible_at:
        wait = (attempt.start_at - attempt.eligible_at).total_seconds()
    return {
        "cluster": attempt.cluster,
        "job_id": attempt.job_id,
        "job_id_raw": attempt.job_id_raw,
        "attempt": attempt.attempt_number,
        "attempts": attempt.attempts,
        "name": attempt.name,
        "user": attempt.user,
        "account": attempt.account,
        "partition": attempt.partition,
        "state": attempt.state,
        "outcome": attempt.outcome,
        "exit_code": attempt.exit_code,
        "submit_at": attempt.submit_at,
        "eligible_at": attempt.eligible_at,
        "start_at": attempt.start_at,
        "end_at": attempt.end_at,
        "elapsed_seconds": elapsed,
        "queue_wait_seconds": wait,
        "gpus": attempt.alloc_gpus,
        "gpu_model": attempt.gpu_model,
        "nodes": list(attempt.nodes),
        "gpu_figures": [gpu_row(g) for g in gpus],
        "advice": advise(JobFacts(attempt.alloc_gpus, elapsed, attempt.state), gpus),
    }


def write_job_text(reports: Sequence[Mapping[str, Any]], out: TextIO, zone: tzinfo) -> None:
    for i, r in enumerate(reports):
        if i:
            out.write("\n")
        of = f", attempt {r['attempt']} of {r['attempts']}" if r["attempts"] > 1 else ""
        out.write(f"Job {r['job_id']} ({r['name']}) on cluster {r['cluster']}{of}\n")
        header = [
            ("user", r["user"]),
            ("account", r["account"]),
            ("partition", r["partition"]),
            ("state", f"{r['state']} (exit code {r['exit_code'] or '-'}, {r['outcome']})"),
            ("start", _local(r["start_at"], zone) or "not started"),
            ("end", _local(r["end_at"], zone) or ("running" if r["start_at"] else "")),
            ("elapsed", _duration(r["elapsed_seconds"])),
            ("GPUs", f"{r['gpus']}{' x ' + r['gpu_model'] if r['gpu_model'] else ''}"),
            ("nodes", ",".join(r["nodes"])),
            ("queue wait", _duration(r["queue_wait_seconds"])),
        ]
        for label, value in header:
            out.write(f"  {label:<11} {value}".rstrip() + "\n")
        if r["gpu_figures"]:
            out.write("\n")
            columns = [
                "gpu_uuid",
                "node",
                "mapping",
                "mean_util_percent",
                "max_util_percent",
                "idle_percent",
                "coverage_percent",
                "max_memory_gib",
                "energy",
            ]
            render(r["gpu_figures"], out, "table", columns=columns)
        if r["advice"]:
            out.write("\nAdvice:\n")
            for line in r["advice"]:
                out.write(f"  * {line}\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def cmd_job(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.reports.plot import plot_utilisation, utilisation_series
    from slurmtel.store.jobview import JOB_ID, find_attempts, gpu_figures, util_windows

    if not JOB_ID.fullmatch(args.jobid):
        raise ConfigError(f"'{args.jobid}' is not a job id (forms: 123, 10_4 for an array task, 123+1)")
    scope = scope_for(config, Action.VIEW_JOBS)
    ctx = open_context(config)
    now = ctx.clock()
    zone = config.zone
    with ctx.engine.connect() as conn:
        attempts = find_attempts(conn, args.jobid, scope=scope, clusters=split_list(args.clusters))
        if not attempts:
            # the same answer for a job outside the caller's scope: existence is not disclosed
            print(f"slurmtel: job {args.jobid} not found", file=sys.stderr)
            return EXIT_ERROR
        figures = gpu_figures(conn, [a.key for a in attempts])
        series = {}
        if args.plot is not None:
            for a in attempts:
                if a.start_at is None:
                    continue
                uuids = sorted({g.gpu_uuid for g in figures[a.key] if g.mapped and g.gpu_uuid})
                windows = util_windows(conn, uuids, start=a.start_at, end=a.end_at or now)
                for uuid, points in utilisation_series(windows).items():
                    label = f"{uuid} (attempt {a.attempt_number})" if len(attempts) > 1 else uuid
                    series[label] = points
    reports = [attempt_report(a, figures[a.key], now, zone) for a in attempts]
    if args.format == "json":
        json.dump(reports, sys.stdout, indent=2, default=_json_default)
        sys.stdout.write("\n")
    else:
        write_job_text(reports, sys.stdout, zone)
    if args.plot is not None:
        title = f"Job {attempts[0].job_id} ({attempts[0].cluster}): GPU utilisation"
        plot_utilisation(series, args.plot, title=title, zone=zone)
        if not series:
            print(f"slurmtel: no GPU telemetry for job {args.jobid}: the plot is empty", file=sys.stderr)
        print(f"slurmtel: wrote {args.plot}", file=sys.stderr)
    return EXIT_OK


# ------------------------------------------------------------------------------------- me


def _month(moment: datetime, zone: tzinfo) -> str:
    local = moment.astimezone(zone)
    return f"{local.year:04d}-{local.month:02d}"


def _hours(seconds: Any) -> float:
    return round(float(seconds or 0) / 3600, 4)


def me_summary(user: str, month: str, usage: Mapping[str, Any]) -> dict[str, Any]:
    covered = float(usage["t_covered"])
    return {
        "user": user,
        "month": month,
        "jobs": int(usage["jobs"]),
        "attempts": int(usage["attempts"]),
        "gpu_hours": _hours(usage["gpu_seconds"]),
        "failed_gpu_hours": _hours(usage["failed_gpu_seconds"]),
        "measured_gpu_hours": _hours(covered),
        "unmeasured_gpu_hours": _hours(usage["t_unmeasured"]),
        "idle_gpu_hours": _hours(usage["t_idle"]),
        "idle_percent": _share(float(usage["t_idle"]), covered),
        "mean_util_percent": round(float(usage["t_util_weighted"]) / covered, 1) if covered > 0 else None,
    }


def me_top_job(row: Mapping[str, Any]) -> dict[str, Any]:
    covered = float(row["covered"] or 0)
    return {
        "cluster": row["cluster"],
        "job_id": row["job_id"],
        "name": row["name"],
        "account": row["account"],
        "state": row["state"],
        "attempts": int(row["attempts"]),
        "gpus": int(row["gpus"]),
        "gpu_hours": _hours(row["gpu_seconds"]),
        "idle_percent": _share(float(row["idle"] or 0), covered),
        "mean_util_percent": round(float(row["util_weighted"] or 0) / covered, 1) if covered > 0 else None,
        "coverage_percent": _share(covered, float(row["allocated"] or 0)),
    }


def cmd_me(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.jobview import month_summary, top_jobs

    identity = common.current_identity(config)  # looked up at call time (tests replace it)
    scope = scope_for(config, Action.VIEW_JOBS, identity)
    user = args.user or identity.user
    if user != identity.user and not scope.everything and not scope.accounts:
        raise AccessDenied(f"{identity.user} may only see their own usage, not {user}'s")
    if args.top < 0:
        raise ConfigError("--top must be 0 or more")
    ctx = open_context(config)
    now = ctx.clock()
    zone = config.zone
    month = args.month or _month(now, zone)
    try:
        start, end = month_bounds(month, zone)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    first_day = start.astimezone(zone).date()
    end_day = end.astimezone(zone).date()
    with ctx.engine.connect() as conn:
        usage = month_summary(
            conn, user=user, start=start, end=end, first_day=first_day, end_day=end_day, now=now, scope=scope
        )
        jobs = []
        if args.top:
            jobs = top_jobs(
                conn,
                user=user,
                start=start,
                end=end,
                first_day=first_day,
                end_day=end_day,
                now=now,
                scope=scope,
                limit=args.top,
            )
    summary = me_summary(user, month, usage)
    top = [me_top_job(r) for r in jobs]
    if args.format == "json":
        json.dump({**summary, "top_jobs": top}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    title = f"GPU use of {user} in {month}" + (" (so far)" if start <= now < end else "")
    rows = [{"figure": k, "value": v} for k, v in summary.items() if k not in ("user", "month")]
    render(rows, sys.stdout, "table", columns=["figure", "value"], title=title)
    sys.stdout.write("\n")
    render(
        top, sys.stdout, "table", columns=TOP_COLUMNS, title=f"Top {len(top)} jobs by GPU-hours in {month}"
    )
    return EXIT_OK
