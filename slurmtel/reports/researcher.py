"""A researcher's own jobs and month (DESIGN §7): what `slurmtel job JOBID` and `slurmtel me`
show, computed once for the CLI and the API (`/v1/jobs/{id}`, `/v1/me`).

job_document and me_document read the store for a caller's scope and return plain documents
(dicts and lists); write_job_text and write_me print them. The CLI prints a document it computed
itself or one the API sent (slurmtel.api.client), so both print the same.

Scope mirrors Slurm (slurmtel.access): a user sees their own jobs, a coordinator their
accounts' jobs, admins everything. A job outside the caller's scope is reported exactly like a
job that does not exist.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any, TextIO

from slurmtel.access import Action, Identity, Scope, allowed
from slurmtel.bounds import check_count, check_name
from slurmtel.errors import AccessDenied, ConfigError
from slurmtel.reports.advice import IDLE_GPU_SHARE, GpuFigures, JobFacts, advise, duration_text
from slurmtel.reports.render import escape_controls, render
from slurmtel.timeparse import month_bounds

if TYPE_CHECKING:
    from slurmtel.reports.plot import GpuSeries, SeriesPoint
    from slurmtel.store.efficiency import AttemptEfficiency
    from slurmtel.store.jobview import AttemptView
    from slurmtel.store.sql import Connection


@dataclass(frozen=True)
class JobQuery:
    """`slurmtel job JOBID` / `/v1/jobs/JOBID` for a caller: built by job_query."""

    jobid: str
    clusters: tuple[str, ...]
    now: datetime
    zone: tzinfo
    scope: Scope


@dataclass(frozen=True)
class MeQuery:
    """`slurmtel me` / `/v1/me` for a caller: built by me_query."""

    user: str
    month: str
    start: datetime
    end: datetime
    now: datetime
    zone: tzinfo
    scope: Scope
    jobs: bool
    top: int


def _scope(identity: Identity, action: Action) -> Scope:
    scope = allowed(identity, action)
    if scope.is_empty:
        raise AccessDenied(
            f"{identity.user} ({identity.role.value}) may not {action.value.replace('_', ' ')}"
        )
    return scope


def job_query(
    identity: Identity, jobid: str, *, clusters: Sequence[str], now: datetime, zone: tzinfo
) -> JobQuery:
    """What IDENTITY may ask of JOBID (AccessDenied without the job-detail right)."""
    return JobQuery(jobid, tuple(clusters), now, zone, _scope(identity, Action.VIEW_JOBS))


def me_query(
    identity: Identity,
    *,
    user: str | None,
    month: str | None,
    now: datetime,
    zone: tzinfo,
    jobs: bool,
    top: int,
) -> MeQuery:
    """IDENTITY's month, or USER's (admins; coordinators, whose scope then limits the rows):
    AccessDenied for another user's month otherwise, ConfigError for a bad month or top."""
    scope = _scope(identity, Action.VIEW_JOBS)
    who = user or identity.user
    if who != identity.user and not scope.everything and not scope.accounts:
        raise AccessDenied(f"{identity.user} may only see their own usage, not {who}'s")
    check_count(top, "--top")
    if user:
        check_name(user, "--user")
    month = month or month_of(now, zone)
    try:
        start, end = month_bounds(month, zone)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return MeQuery(who, month, start, end, now, zone, scope, jobs, top)


GIB = 2**30
JOB_FORMATS = ("table", "json")
ME_FORMATS = ("table", "csv", "json")
# `me --jobs`: tables in hours and GiB, csv/json in seconds and bytes
ME_JOBS_COLUMNS = (
    "cluster",
    "job_id",
    "attempt",
    "name",
    "account",
    "partition",
    "state",
    "start",
    "elapsed_hours",
    "gpus",
    "gpu_hours",
    "mean_util_percent",
    "idle_percent",
    "cpu_efficiency_percent",
    "mem_peak_gib",
    "mem_requested_gib",
    "mem_used_percent",
)
ME_JOBS_DATA_COLUMNS = tuple(
    {
        "start": "start_at",
        "elapsed_hours": "elapsed_seconds",
        "gpu_hours": "gpu_seconds",
        "mem_peak_gib": "mem_peak_bytes",
        "mem_requested_gib": "mem_requested_bytes",
    }.get(c, c)
    for c in ME_JOBS_COLUMNS
)
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


# ------------------------------------------------------------------------------------ job


def _duration(seconds: float | None) -> str:
    """Slurm's [D-]HH:MM:SS; "" for None."""
    return "" if seconds is None else duration_text(seconds)


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
    power = g.power_mean_watts
    return {
        "gpu": g.name,
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
        "power_mean_watts": None if power is None else round(power, 1),
        "power_max_watts": None if g.power_max_watts is None else round(g.power_max_watts, 1),
        "energy_joules": None if g.energy_joules is None else round(g.energy_joules, 1),
        "energy": energy_text(g.energy_joules),
    }


def attempt_report(
    attempt: AttemptView,
    gpus: Sequence[GpuFigures],
    now: datetime,
    zone: tzinfo,
    host: AttemptEfficiency | None = None,
) -> dict[str, Any]:
    """One attempt's header, host-side usage (HOST: CPU efficiency, peak memory, time limit),
    per-GPU figures and advice."""
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
        "cpus": host.alloc_cpus if host else None,
        "cpu_time_seconds": host.cpu_time_seconds if host else None,
        "cpu_efficiency_percent": host.cpu_efficiency_percent if host else None,
        "mem_requested_bytes": host.mem_requested_bytes if host else None,
        "mem_peak_bytes": host.mem_peak_bytes if host else None,
        "mem_peak_task_bytes": host.mem_peak_task_bytes if host else None,
        "mem_used_percent": host.mem_efficiency_percent if host else None,
        "usage_steps": host.usage_steps if host else None,
        "time_limit_seconds": attempt.time_limit_seconds,
        "time_limit_used_percent": _share(elapsed, attempt.time_limit_seconds)
        if elapsed is not None and attempt.time_limit_seconds
        else None,
        "gpu_figures": [gpu_row(g) for g in gpus],
        "advice": advise(
            JobFacts(
                attempt.alloc_gpus,
                elapsed,
                attempt.state,
                alloc_cpus=host.alloc_cpus if host else 0,
                cpu_efficiency_percent=host.cpu_efficiency_percent if host else None,
                mem_requested_bytes=host.mem_requested_bytes if host else None,
                mem_peak_bytes=host.mem_peak_bytes if host else None,
                nodes=max(len(attempt.nodes), 1),
                time_limit_seconds=attempt.time_limit_seconds,
            ),
            gpus,
        ),
    }


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value / GIB:.1f} GiB"


def host_lines(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The CPU, host memory and time limit lines of a job's text."""
    steps = r["usage_steps"]
    partial = " so far" if r["end_at"] is None else ""
    unmeasured = "not measured (no job steps read)"
    cpus = f"{r['cpus']} CPU{'s' if r['cpus'] != 1 else ''}" if r["cpus"] else ""
    if r["cpu_efficiency_percent"] is not None:
        cpu = (
            f"{cpus}, efficiency {r['cpu_efficiency_percent']:.1f} %{partial} "
            f"(CPU time {_duration(r['cpu_time_seconds'])})"
        )
    else:
        cpu = f"{cpus}, efficiency {unmeasured if steps is None else 'unknown'}".lstrip(", ")
    if r["mem_peak_bytes"] is not None:
        memory = f"peak {_gib(r['mem_peak_bytes'])}{partial}"
        if r["mem_requested_bytes"]:
            memory += f" of {_gib(r['mem_requested_bytes'])} requested ({r['mem_used_percent']:.1f} %)"
        if r["mem_peak_task_bytes"] is not None and r["mem_peak_task_bytes"] != r["mem_peak_bytes"]:
            memory += f", largest task {_gib(r['mem_peak_task_bytes'])}"
    else:
        requested = f"{_gib(r['mem_requested_bytes'])} requested, " if r["mem_requested_bytes"] else ""
        memory = f"{requested}peak {unmeasured if steps is None else 'not recorded'}"
    limit = r["time_limit_seconds"]
    if limit and r["elapsed_seconds"] is not None:
        time = (
            f"{_duration(r['elapsed_seconds'])} used of {_duration(limit)} "
            f"({r['time_limit_used_percent']:.1f} %)"
        )
    elif limit:
        time = _duration(limit)
    else:
        time = "none (or not known)"
    return [("CPUs", cpu), ("host memory", memory), ("time limit", time)]


def write_job_text(reports: Sequence[Mapping[str, Any]], out: TextIO, zone: tzinfo) -> None:
    for i, r in enumerate(reports):
        if i:
            out.write("\n")
        of = f", attempt {r['attempt']} of {r['attempts']}" if r["attempts"] > 1 else ""
        # names come from the job's submitter: shown literally, control characters escaped
        out.write(escape_controls(f"Job {r['job_id']} ({r['name']}) on cluster {r['cluster']}{of}") + "\n")
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
            *(host_lines(r) if r["start_at"] else []),
        ]
        for label, value in header:
            out.write(escape_controls(f"  {label:<11} {value}".rstrip()) + "\n")
        if r["gpu_figures"]:
            out.write("\n")
            columns = [
                "gpu",
                "gpu_uuid",
                "mapping",
                "mean_util_percent",
                "max_util_percent",
                "idle_percent",
                "coverage_percent",
                "max_memory_gib",
                "power_mean_watts",
                "power_max_watts",
                "energy",
            ]
            render(r["gpu_figures"], out, "table", columns=columns)
        if r["advice"]:
            out.write("\nAdvice:\n")
            for line in r["advice"]:
                out.write(f"  * {escape_controls(line)}\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def job_document(conn: Connection, q: JobQuery) -> list[dict[str, Any]]:
    """Every attempt of the job in the query's scope as attempt_report gives it; [] when there is
    none (a job outside the scope is not found, exactly like one that does not exist)."""
    from slurmtel.store.efficiency import attempts_efficiency
    from slurmtel.store.jobview import find_attempts, gpu_figures

    attempts = find_attempts(conn, q.jobid, scope=q.scope, clusters=q.clusters)
    if not attempts:
        return []
    keys = [a.key for a in attempts]
    figures = gpu_figures(conn, keys, now=q.now)
    host = attempts_efficiency(conn, keys, now=q.now)
    return [attempt_report(a, figures[a.key], q.now, q.zone, host.get(a.key)) for a in attempts]


def job_plot(conn: Connection, q: JobQuery, fmt: str) -> tuple[bytes, bool] | None:
    """The job's GPU utilisation, memory and power over time as FMT (png, svg, pdf) bytes, and
    whether any GPU had telemetry; None when the job is not found in the query's scope."""
    from slurmtel.reports.plot import plot_job, utilisation_series
    from slurmtel.store.jobview import find_attempts, gpu_figures, util_windows

    now, zone = q.now, q.zone
    attempts = find_attempts(conn, q.jobid, scope=q.scope, clusters=q.clusters)
    if not attempts:
        return None
    figures = gpu_figures(conn, [a.key for a in attempts], now=now)
    series: list[GpuSeries] = []
    for a in sorted(attempts, key=lambda a: a.submit_at):
        if a.start_at is None:
            continue
        by_uuid = {g.gpu_uuid: g for g in figures[a.key] if g.mapped and g.gpu_uuid}
        windows = util_windows(conn, sorted(by_uuid), start=a.start_at, end=a.end_at or now)
        points = utilisation_series(windows)
        for g in sorted(by_uuid.values(), key=lambda g: (g.node, g.gpu_index or 0, g.gpu_uuid)):
            series.append(plot_series(g, points.get(g.gpu_uuid, []), a, several=len(attempts) > 1))
    title = f"Job {attempts[0].job_id} ({attempts[0].cluster}): GPU utilisation, memory, power"
    buffer = io.BytesIO()
    plot_job(series, buffer, title=title, zone=zone, fmt=fmt)
    return buffer.getvalue(), any(s.points for s in series)


def write_job(reports: Sequence[Mapping[str, Any]], out: TextIO, fmt: str, zone: tzinfo) -> None:
    if fmt == "json":
        json.dump(reports, out, indent=2, default=_json_default)
        out.write("\n")
    else:
        write_job_text(reports, out, zone)


def plot_series(
    g: GpuFigures, points: Sequence[SeriesPoint], attempt: AttemptView, *, several: bool
) -> GpuSeries:
    """One GPU's plotted line: `node/index`, the attempt where a job has several, idle noted."""
    from slurmtel.reports.plot import GpuSeries

    label = g.name + (f" (attempt {attempt.attempt_number})" if several else "")
    share = g.idle_share
    if share is not None and share >= IDLE_GPU_SHARE:
        return GpuSeries(f"{label} idle {share * 100:.0f} %", list(points), idle=True)
    return GpuSeries(label, list(points))


# ------------------------------------------------------------------------------------- me


def month_of(moment: datetime, zone: tzinfo) -> str:
    """The site month (YYYY-MM) MOMENT falls in."""
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


def me_job_row(row: Mapping[str, Any], zone: tzinfo) -> dict[str, Any]:
    """One attempt of `me --jobs`, in both units: the table's (hours, GiB, local start) and
    csv/json's (seconds, bytes, ISO start)."""
    e = row["efficiency"]
    covered = float(row["covered"] or 0)
    elapsed = e.elapsed_seconds
    return {
        "cluster": row["cluster"],
        "job_id": row["job_id"],
        "attempt": int(row["attempt_number"] or 1),
        "name": row["name"],
        "account": row["account"],
        "partition": row["partition"],
        "state": row["state"],
        "start": _local(row["start_at"], zone),
        "start_at": row["start_at"],
        "elapsed_hours": None if elapsed is None else _hours(elapsed),
        "elapsed_seconds": None if elapsed is None else round(elapsed, 3),
        "gpus": int(row["alloc_gpus"]),
        "gpu_hours": _hours(row["gpu_seconds"]),
        "gpu_seconds": round(float(row["gpu_seconds"] or 0), 3),
        "mean_util_percent": round(float(row["util_weighted"] or 0) / covered, 1) if covered > 0 else None,
        "idle_percent": _share(float(row["idle"] or 0), covered),
        "cpu_efficiency_percent": None
        if e.cpu_efficiency_percent is None
        else round(e.cpu_efficiency_percent, 1),
        "mem_peak_gib": None if e.mem_peak_bytes is None else round(e.mem_peak_bytes / GIB, 2),
        "mem_peak_bytes": e.mem_peak_bytes,
        "mem_requested_gib": None if e.mem_requested_bytes is None else round(e.mem_requested_bytes / GIB, 2),
        "mem_requested_bytes": e.mem_requested_bytes,
        "mem_used_percent": None if e.mem_efficiency_percent is None else round(e.mem_efficiency_percent, 1),
    }


def me_document(conn: Connection, q: MeQuery) -> dict[str, Any]:
    """The user's month in the query's scope: the summary and top jobs, or (jobs) every attempt."""
    from slurmtel.store.jobview import month_summary, top_jobs, user_attempts

    user, month, start, end, now, zone = q.user, q.month, q.start, q.end, q.now, q.zone
    window: dict[str, Any] = {
        "user": user,
        "start": start,
        "end": end,
        "first_day": start.astimezone(zone).date(),
        "end_day": end.astimezone(zone).date(),
        "now": now,
        "scope": q.scope,
    }
    document: dict[str, Any] = {"user": user, "month": month, "so_far": start <= now < end, "zone": str(zone)}
    if q.jobs:
        document["jobs"] = [me_job_row(r, zone) for r in user_attempts(conn, **window)]
        return document
    usage = month_summary(conn, **window)
    document["summary"] = me_summary(user, month, usage)
    document["top_jobs"] = [me_top_job(r) for r in top_jobs(conn, **window, limit=q.top)]
    return document


def write_me(document: Mapping[str, Any], out: TextIO, fmt: str) -> None:
    user, month, zone = document["user"], document["month"], document["zone"]
    so_far = " (so far)" if document["so_far"] else ""
    if "jobs" in document:
        rows = document["jobs"]
        if fmt == "table":
            title = f"Jobs of {user} in {month}{so_far} ({zone}): {len(rows)} attempt{'s' if len(rows) != 1 else ''}"
            render(rows, out, "table", columns=ME_JOBS_COLUMNS, title=title)
        else:
            render(rows, out, fmt, columns=ME_JOBS_DATA_COLUMNS)
        return
    summary, top = document["summary"], document["top_jobs"]
    if fmt == "json":
        json.dump({**summary, "top_jobs": top}, out, indent=2)
        out.write("\n")
        return
    rows = [{"figure": k, "value": v} for k, v in summary.items() if k not in ("user", "month")]
    render(rows, out, "table", columns=["figure", "value"], title=f"GPU use of {user} in {month}{so_far}")
    out.write("\n")
    title = f"Top {len(top)} jobs by GPU-hours in {month}" if top else f"No jobs in {month}"
    render(top, out, "table", columns=TOP_COLUMNS, title=title)
