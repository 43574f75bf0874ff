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
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO

from slurmtel.access import Action, Identity, Scope, allowed
from slurmtel.bounds import check_count, check_name
from slurmtel.config import ChargebackConfig, IdleCausesConfig
from slurmtel.errors import AccessDenied, ConfigError
from slurmtel.reports.advice import IDLE_GPU_SHARE, JobFacts, advise, duration_text
from slurmtel.reports.render import escape_controls, render
from slurmtel.timeparse import month_bounds

if TYPE_CHECKING:
    from slurmtel.jobrows import GpuFigures
    from slurmtel.reports.plot import GpuSeries, SeriesPoint
    from slurmtel.store.efficiency import AttemptEfficiency
    from slurmtel.store.jobview import AttemptView
    from slurmtel.store.samples import SampleStore
    from slurmtel.store.sql import Connection


@dataclass(frozen=True)
class JobQuery:
    """`slurmtel job JOBID` / `/v1/jobs/JOBID` for a caller: built by job_query."""

    jobid: str
    clusters: tuple[str, ...]
    now: datetime
    zone: tzinfo
    scope: Scope
    # price per kWh and grid carbon intensity ([chargeback]): the GPUs' energy as money and CO2e
    pricing: ChargebackConfig | None = None
    # where the job's windows are read from (telemetry.sample_store); None: PostgreSQL
    samples: SampleStore | None = None
    # [idle_causes]: the checkpoint and start-up thresholds
    causes: IdleCausesConfig | None = None


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
    # price per kWh and grid carbon intensity ([chargeback]): the GPUs' energy as money and CO2e
    pricing: ChargebackConfig | None = None


def _scope(identity: Identity, action: Action) -> Scope:
    scope = allowed(identity, action)
    if scope.is_empty:
        raise AccessDenied(
            f"{identity.user} ({identity.role.value}) may not {action.value.replace('_', ' ')}"
        )
    return scope


def job_query(
    identity: Identity,
    jobid: str,
    *,
    clusters: Sequence[str],
    now: datetime,
    zone: tzinfo,
    pricing: ChargebackConfig | None = None,
    samples: SampleStore | None = None,
    causes: IdleCausesConfig | None = None,
) -> JobQuery:
    """What IDENTITY may ask of JOBID (AccessDenied without the job-detail right)."""
    return JobQuery(
        jobid, tuple(clusters), now, zone, _scope(identity, Action.VIEW_JOBS), pricing, samples, causes
    )


def me_query(
    identity: Identity,
    *,
    user: str | None,
    month: str | None,
    now: datetime,
    zone: tzinfo,
    jobs: bool,
    top: int,
    pricing: ChargebackConfig | None = None,
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
    return MeQuery(who, month, start, end, now, zone, scope, jobs, top, pricing)


GIB = 2**30
JOB_FORMATS = ("table", "json")
ME_FORMATS = ("table", "csv", "json")
# `me --jobs`: every column in CSV/JSON; a table converts units (reports.render.for_table)
ME_JOBS_COLUMNS = (
    "cluster",
    "job_id",
    "attempt",
    "name",
    "account",
    "partition",
    "state",
    "start_at",
    "elapsed_seconds",
    "gpus",
    "allocated_gpu_seconds",
    "mean_util_share",
    "idle_share",
    "cpu_efficiency_share",
    "mem_peak_bytes",
    "mem_requested_bytes",
    "mem_efficiency_share",
)
# what a narrow `me --jobs` table keeps: the job and its GPU figures
ME_JOBS_KEY_COLUMNS = ("job_id", "allocated_gpu_seconds", "idle_share", "mean_util_share", "gpus", "state")
TOP_COLUMNS = (
    "cluster",
    "job_id",
    "name",
    "account",
    "state",
    "attempts",
    "gpus",
    "allocated_gpu_seconds",
    "idle_share",
    "mean_util_share",
    "covered_share",
)
# one attempt of `slurmtel job` (then its `gpu_figures`, GPU_COLUMNS, and `advice` lines)
JOB_COLUMNS = (
    "cluster",
    "job_id",
    "job_id_raw",
    "attempt",
    "attempts",
    "name",
    "user",
    "account",
    "partition",
    "state",
    "outcome",
    "exit_code",
    "submit_at",
    "eligible_at",
    "start_at",
    "end_at",
    "elapsed_seconds",
    "queue_wait_seconds",
    "gpus",
    "gpu_model",
    "nodes",
    "cpus",
    "cpu_time_seconds",
    "cpu_efficiency_share",
    "mem_requested_bytes",
    "mem_peak_bytes",
    "mem_peak_task_bytes",
    "mem_efficiency_share",
    "usage_steps",
    "time_limit_seconds",
    "time_limit_used_share",
    "gpu_energy_joules",
    "gpu_energy_amount",
    "gpu_co2e_kilograms",
    "gpu_cost_amount",
    "currency",
    "so_far",
    "so_far_at",
)
# one GPU of `slurmtel job`
GPU_COLUMNS = (
    "gpu",
    "gpu_uuid",
    "node",
    "mapping",
    "allocated_gpu_seconds",
    "mean_util_share",
    "max_util_share",
    "idle_share",
    "covered_share",
    "memory_used_max_bytes",
    "memory_total_bytes",
    "power_mean_watts",
    "power_max_watts",
    "power_limit_watts",
    "energy_joules",
)
GPU_TABLE_COLUMNS = (
    "gpu",
    "gpu_uuid",
    "mapping",
    "mean_util_share",
    "max_util_share",
    "idle_share",
    "covered_share",
    "memory_used_max_bytes",
    "power_mean_watts",
    "power_max_watts",
    "energy_joules",
)
# what a narrow GPU table of `slurmtel job` keeps
GPU_KEY_COLUMNS = ("gpu", "mean_util_share", "idle_share", "memory_used_max_bytes", "power_mean_watts")
# the GPUs' energy, its price and CO2e, where measured (and priced): a job's and a month's
ME_ENERGY_COLUMNS = ("gpu_energy_joules", "gpu_energy_amount", "gpu_co2e_kilograms", "currency")
# the figures of `me`'s summary (user and month are its heading)
ME_SUMMARY_COLUMNS = (
    "jobs",
    "attempts",
    "allocated_gpu_seconds",
    "failed_gpu_seconds",
    "covered_gpu_seconds",
    "unmeasured_gpu_seconds",
    "idle_gpu_seconds",
    "idle_share",
    "mean_util_share",
)


# ------------------------------------------------------------------------------------ job


def _duration(seconds: float | None) -> str:
    """Slurm's [D-]HH:MM:SS; "" for None."""
    return "" if seconds is None else duration_text(seconds)


def _local(moment: datetime | None, zone: tzinfo) -> str:
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z") if moment else ""


def _share(numerator: float, denominator: float | None) -> float | None:
    """A fraction to 4 places; None where the whole is 0 or unknown."""
    return round(numerator / denominator, 4) if denominator else None


def energy_text(joules: float) -> str:
    """Energy as a person reads it: kWh from 1 kWh on, else Wh."""
    wh = joules / 3600
    return f"{wh / 1000:.2f} kWh" if wh >= 1000 else f"{wh:.1f} Wh"


def _percent_share(percent: float | None) -> float | None:
    """A figure the store keeps in percent as the registered fraction."""
    return None if percent is None else round(percent / 100, 4)


def gpu_row(g: GpuFigures) -> dict[str, Any]:
    """The registered figures of one GPU (GPU_COLUMNS)."""
    power = g.power_mean_watts
    return {
        "gpu": g.name,
        "gpu_uuid": g.gpu_uuid or "(unmapped)",
        "node": g.node,
        "mapping": g.mapping,
        "allocated_gpu_seconds": round(g.allocated_seconds, 3),
        "mean_util_share": _percent_share(g.mean_util_percent),
        "max_util_share": _percent_share(g.util_max_percent),
        "idle_share": _share(g.idle_seconds, g.covered_seconds),
        "covered_share": _share(g.covered_seconds, g.allocated_seconds),
        "memory_used_max_bytes": g.memory_used_max_bytes,
        "memory_total_bytes": g.memory_total_bytes or None,
        "power_mean_watts": None if power is None else round(power, 1),
        "power_max_watts": None if g.power_max_watts is None else round(g.power_max_watts, 1),
        "power_limit_watts": None if g.power_limit_watts is None else round(g.power_limit_watts, 1),
        "energy_joules": None if g.energy_joules is None else round(g.energy_joules, 1),
    }


@dataclass(frozen=True)
class GpuEnergy:
    """Measured GPU energy alone (a month's, for `me`)."""

    energy_joules: float | None


def _prices_energy(pricing: ChargebackConfig) -> bool:
    """Whether the config prices energy or counts its CO2e (else no figure needs pricing)."""
    return bool(pricing.price_per_kwh.strip() or pricing.carbon_grams_per_kwh.strip())


def gpu_energy_figures(
    gpus: Sequence[GpuFigures | GpuEnergy], pricing: ChargebackConfig | None
) -> dict[str, Any]:
    """The GPUs' measured energy (NVML/DCGM), and with chargeback.price_per_kwh and
    chargeback.carbon_grams_per_kwh its price and kg CO2e (each rounded once)."""
    measured = [g.energy_joules for g in gpus if g.energy_joules is not None]
    joules = Decimal(str(round(sum(measured), 1))) if measured else None
    amount = co2e = None
    if joules is not None and pricing is not None and _prices_energy(pricing):
        # the chargeback package only where there is something to price (issue 28: a job's
        # start does not load it)
        from slurmtel.chargeback.pricing import amount_of, co2e_of, quantity

        kwh = quantity("energy", joules)
        if pricing.price_per_kwh.strip():
            amount = amount_of(Decimal(pricing.price_per_kwh), kwh, pricing.currency)
        co2e = co2e_of(kwh, pricing)
    return {
        "gpu_energy_joules": joules,
        "gpu_energy_amount": amount,
        "gpu_co2e_kilograms": co2e,
        "currency": pricing.currency if amount is not None and pricing is not None else None,
    }


def attempt_report(
    attempt: AttemptView,
    gpus: Sequence[GpuFigures],
    now: datetime,
    zone: tzinfo,
    host: AttemptEfficiency | None = None,
    pricing: ChargebackConfig | None = None,
) -> dict[str, Any]:
    """One attempt's header, host-side usage (HOST: CPU efficiency, peak memory, time limit),
    per-GPU figures and advice. A running attempt (started, not ended) has no exit code yet, and
    its figures and advice are so far: `so_far`, up to `so_far_at` (the site clock's now)."""
    running = attempt.start_at is not None and attempt.end_at is None
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
        # sacct prints 0:0 for a job that has not ended: not an exit code yet
        "exit_code": attempt.exit_code if attempt.end_at is not None else None,
        "so_far": running,
        "so_far_at": now if running else None,
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
        "cpu_efficiency_share": _percent_share(host.cpu_efficiency_percent) if host else None,
        "mem_requested_bytes": host.mem_requested_bytes if host else None,
        "mem_peak_bytes": host.mem_peak_bytes if host else None,
        "mem_peak_task_bytes": host.mem_peak_task_bytes if host else None,
        "mem_efficiency_share": _percent_share(host.mem_efficiency_percent) if host else None,
        "usage_steps": host.usage_steps if host else None,
        "time_limit_seconds": attempt.time_limit_seconds,
        "time_limit_used_share": _share(elapsed, attempt.time_limit_seconds) if elapsed is not None else None,
        **_with_cost(gpu_energy_figures(gpus, pricing), attempt, elapsed, pricing),
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
                running=running,
            ),
            gpus,
        ),
    }


def gpu_cost(
    attempt: AttemptView, elapsed_seconds: float | None, pricing: ChargebackConfig | None
) -> Decimal | None:
    """What the attempt's allocated GPU-hours cost (so far, while it runs) at the
    [[chargeback.rates]] GPU rate matching its partition and GPU model on the day it started,
    rounded once as a statement rounds; None without a matching rate."""
    if (
        pricing is None
        or not pricing.rates
        or not attempt.alloc_gpus
        or not elapsed_seconds
        or attempt.start_at is None
    ):
        return None
    # the chargeback package only with rates to match (a job's start does not load it)
    from slurmtel.chargeback.pricing import charge, match_rate

    rate = match_rate(pricing.rates, attempt.partition, attempt.gpu_model or "", attempt.start_at.date())
    if rate is None:
        return None
    seconds = Decimal(str(round(elapsed_seconds, 3))) * attempt.alloc_gpus
    return charge(rate.price(), seconds, pricing.currency)


def _with_cost(
    figures: dict[str, Any], attempt: AttemptView, elapsed: float | None, pricing: ChargebackConfig | None
) -> dict[str, Any]:
    cost = gpu_cost(attempt, elapsed, pricing)
    priced = cost is not None or figures["gpu_energy_amount"] is not None
    return {
        **figures,
        "gpu_cost_amount": cost,
        "currency": pricing.currency if priced and pricing is not None else None,
    }


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value / GIB:.1f} GiB"


def host_lines(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The CPU, host memory and time limit lines of a job's text. A running attempt's figures are
    so far; while its steps run sacct has none (slurmdbd records a step's usage when it ends)."""
    steps = r["usage_steps"]
    running = bool(r.get("so_far"))
    partial = " so far" if r["end_at"] is None else ""
    unmeasured = "not measured (no job steps read)"
    not_yet = "not known yet (sacct reports a step's usage when the step ends)"
    cpus = f"{r['cpus']} CPU{'s' if r['cpus'] != 1 else ''}" if r["cpus"] else ""
    if running and steps is not None and not r["cpu_time_seconds"]:
        cpu = f"{cpus}, efficiency {not_yet}".lstrip(", ")
    elif r["cpu_efficiency_share"] is not None:
        ended = " (its ended steps)" if running else ""
        cpu = (
            f"{cpus}, efficiency {100 * r['cpu_efficiency_share']:.1f} %{partial}{ended} "
            f"(CPU time {_duration(r['cpu_time_seconds'])})"
        )
    else:
        cpu = f"{cpus}, efficiency {unmeasured if steps is None else 'unknown'}".lstrip(", ")
    if r["mem_peak_bytes"] is not None:
        memory = f"peak {_gib(r['mem_peak_bytes'])}{partial}"
        if r["mem_requested_bytes"]:
            memory += (
                f" of {_gib(r['mem_requested_bytes'])} requested ({100 * r['mem_efficiency_share']:.1f} %)"
            )
        if r["mem_peak_task_bytes"] is not None and r["mem_peak_task_bytes"] != r["mem_peak_bytes"]:
            memory += f", largest task {_gib(r['mem_peak_task_bytes'])}"
    else:
        requested = f"{_gib(r['mem_requested_bytes'])} requested, " if r["mem_requested_bytes"] else ""
        missing = unmeasured if steps is None else not_yet if running else "not recorded"
        memory = f"{requested}peak {missing}"
    limit = r["time_limit_seconds"]
    if limit and r["elapsed_seconds"] is not None:
        time = (
            f"{_duration(r['elapsed_seconds'])} used{partial} of {_duration(limit)} "
            f"({100 * r['time_limit_used_share']:.1f} %)"
        )
    elif limit:
        time = _duration(limit)
    else:
        time = "none (or not known)"
    return [("CPUs", cpu), ("host memory", memory), ("time limit", time)]


def energy_lines(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The GPUs' cost line (its GPU-hours at the chargeback rate) and energy line of a job's
    text, with the energy's price and CO2e when configured."""
    lines = []
    if r.get("gpu_cost_amount") is not None:
        so_far = " so far" if r["end_at"] is None else ""
        lines.append(("GPU cost", f"{r['gpu_cost_amount']} {r['currency']}{so_far} (chargeback rate)"))
    if r.get("gpu_energy_joules") is None:
        return lines
    parts = [energy_text(float(r["gpu_energy_joules"]))]
    if r.get("gpu_energy_amount") is not None:
        parts.append(f"{r['gpu_energy_amount']} {r['currency']}")
    if r.get("gpu_co2e_kilograms") is not None:
        parts.append(f"{r['gpu_co2e_kilograms']} kg CO2e")
    return [*lines, ("GPU energy", ", ".join(parts) + (" so far" if r["end_at"] is None else ""))]


def _state_text(r: Mapping[str, Any], zone: tzinfo) -> str:
    """The state line: the exit code of an ended attempt; a running one has none yet."""
    if r["exit_code"] is not None:
        return f"{r['state']} (exit code {r['exit_code'] or '-'}, {r['outcome']})"
    if r.get("so_far"):
        at = r.get("so_far_at")
        as_of = f", to {_local(at, zone)}" if isinstance(at, datetime) else ""
        return f"{r['state']} (still running: every figure below is so far{as_of})"
    return f"{r['state']} ({r['outcome']})"


def job_header(r: Mapping[str, Any], zone: tzinfo) -> list[tuple[str, str]]:
    """The labelled lines of one attempt's header, as `slurmtel job` prints them and the job
    page shows them: user, account, partition, state, start and end in ZONE, elapsed, GPUs,
    nodes, queue wait, the host's CPU, memory and time limit, and the GPUs' energy."""
    so_far = bool(r.get("so_far"))
    return [
        ("user", r["user"]),
        ("account", r["account"]),
        ("partition", r["partition"]),
        ("state", _state_text(r, zone)),
        ("start", _local(r["start_at"], zone) or "not started"),
        ("end", _local(r["end_at"], zone) or ("running" if r["start_at"] else "")),
        ("elapsed", _duration(r["elapsed_seconds"]) + (" so far" if so_far else "")),
        ("GPUs", f"{r['gpus']}{' x ' + r['gpu_model'] if r['gpu_model'] else ''}"),
        ("nodes", ",".join(r["nodes"])),
        ("queue wait", _duration(r["queue_wait_seconds"])),
        *(host_lines(r) if r["start_at"] else []),
        *energy_lines(r),
        *idle_cause_lines(r),
    ]


def write_job_text(reports: Sequence[Mapping[str, Any]], out: TextIO, zone: tzinfo) -> None:
    for i, r in enumerate(reports):
        if i:
            out.write("\n")
        of = f", attempt {r['attempt']} of {r['attempts']}" if r["attempts"] > 1 else ""
        so_far = bool(r.get("so_far"))
        # names come from the job's submitter: shown literally, control characters escaped
        out.write(escape_controls(f"Job {r['job_id']} ({r['name']}) on cluster {r['cluster']}{of}") + "\n")
        header = job_header(r, zone)
        for label, value in header:
            out.write(escape_controls(f"  {label:<11} {value}".rstrip()) + "\n")
        if r["gpu_figures"]:
            out.write("\n")
            title = "Per GPU, so far (the job is still running)" if so_far else None
            render(
                r["gpu_figures"], out, "table", columns=GPU_TABLE_COLUMNS, title=title, first=GPU_KEY_COLUMNS
            )
        if r["advice"]:
            out.write("\nAdvice so far (the job is still running):\n" if so_far else "\nAdvice:\n")
            for line in r["advice"]:
                out.write(f"  * {escape_controls(line)}\n")


def job_document(conn: Connection, q: JobQuery) -> list[dict[str, Any]]:
    """Every attempt of the job in the query's scope as attempt_report gives it; [] when there is
    none (a job outside the scope is not found, exactly like one that does not exist)."""
    found = _found(conn, q)
    return [] if found is None else _reports(conn, q, found)


@dataclass(frozen=True)
class _Found:
    """The job's attempts in the query's scope (newest first), each one's GPU figures, idle
    time by cause and host-side figures, and the attempts with a cgroup window (the others have no checkpoint
    estimate to read)."""

    attempts: list[AttemptView]
    figures: dict[Any, list[GpuFigures]]
    idle_causes: dict[Any, list[dict[str, Any]]]
    efficiency: dict[Any, AttemptEfficiency]
    cgroup_measured: frozenset[Any]


def _found(conn: Connection, q: JobQuery) -> _Found | None:
    from slurmtel.store.jobview import gpu_figures_and_causes, read_attempts

    read = read_attempts(conn, q.jobid, scope=q.scope, clusters=q.clusters, now=q.now)
    if not read:
        return None
    attempts = [r.attempt for r in read]
    _prepare_windows(conn, q, attempts)
    starts = [a.start_at for a in attempts if a.start_at is not None]
    ends = [a.end_at or q.now for a in attempts if a.start_at is not None]
    span = (min(starts), max(ends)) if starts else None
    figures, causes = gpu_figures_and_causes(conn, attempts, now=q.now, span=span)
    return _Found(
        attempts,
        figures,
        causes,
        {r.attempt.key: r.efficiency for r in read},
        frozenset(r.attempt.key for r in read if r.cgroup_measured),
    )


def _prepare_windows(conn: Connection, q: JobQuery, attempts: Sequence[AttemptView]) -> None:
    """Have the sample store fetch the windows of the attempts' nodes while they ran (a store
    that keeps them elsewhere: samples.py), for the power and the plot."""
    if q.samples is not None:
        q.samples.prepare_spans(
            conn,
            [(a.nodes, a.start_at, a.end_at or q.now) for a in attempts if a.start_at is not None],
            now=q.now,
        )


def _reports(conn: Connection, q: JobQuery, found: _Found) -> list[dict[str, Any]]:
    reports = []
    for a in found.attempts:
        report = attempt_report(
            a, found.figures[a.key], q.now, q.zone, found.efficiency.get(a.key), q.pricing
        )
        report["idle_by_cause"] = found.idle_causes.get(a.key, [])
        report.update(_checkpoint_figures(conn, a, q, measured=a.key in found.cgroup_measured))
        reports.append(report)
    return reports


def _checkpoint_figures(conn: Connection, a: AttemptView, q: JobQuery, *, measured: bool) -> dict[str, Any]:
    """The attempt's checkpoint episodes and start-up estimate (None each: not measured, as
    for an attempt without a cgroup window: MEASURED false, nothing to read)."""
    names = (
        "checkpoint_episodes",
        "checkpoint_gpu_seconds",
        "checkpoint_write_bytes",
        "startup_seconds",
        "startup_gpu_seconds",
        "startup_read_bytes",
    )
    estimate = None
    if a.start_at is not None and measured:
        # imported only here: an attempt without a cgroup window reads nothing of it, and
        # importing it is about 2 ms of the command's start (issue 28)
        from slurmtel.store.hostside import CheckpointThresholds, checkpoint_estimate

        c = q.causes or IdleCausesConfig()
        estimate = checkpoint_estimate(
            conn,
            cluster=a.cluster,
            job_id_raw=a.job_id_raw,
            submit_at=a.submit_at,
            nodes=a.nodes,
            start_at=a.start_at,
            end_at=a.end_at or q.now,
            gpus=float(a.alloc_gpus),
            thresholds=CheckpointThresholds(
                c.checkpoint_write_bytes, c.checkpoint_dip_percent, c.checkpoint_merge_windows,
                c.startup_active_percent,
            ),
        )  # fmt: skip
    if estimate is None:
        return dict.fromkeys(names)
    return {
        "checkpoint_episodes": estimate.episodes,
        "checkpoint_gpu_seconds": estimate.checkpoint_gpu_seconds,
        "checkpoint_write_bytes": estimate.checkpoint_write_bytes,
        "startup_seconds": estimate.startup_seconds,
        "startup_gpu_seconds": estimate.startup_gpu_seconds,
        "startup_read_bytes": estimate.startup_read_bytes,
    }


def _percent_text(share: Any) -> str:
    """A share as whole percent; a cause present but under half a percent is "<1 %", not 0."""
    percent = 100 * float(share or 0)
    return "<1 %" if 0 < percent < 0.5 else f"{percent:.0f} %"


def idle_cause_lines(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The job text's lines on why its GPUs idled and on checkpoints and start-up."""
    lines: list[tuple[str, str]] = []
    causes = [c for c in r.get("idle_by_cause") or [] if c["idle_gpu_seconds"]]
    if causes:
        parts = [
            f"{c['idle_cause']} {_percent_text(c['idle_cause_share'])}"
            for c in sorted(causes, key=lambda c: -float(c["idle_gpu_seconds"]))
        ]
        lines.append(("idle cause", ", ".join(parts) + " of idle GPU time (estimate)"))
    if r.get("checkpoint_episodes") is not None:
        lines.append(
            (
                "checkpoints",
                f"{r['checkpoint_episodes']} episode(s), GPUs idle {_duration(r['checkpoint_gpu_seconds'])} "
                f"(GPU time), {_gib(r['checkpoint_write_bytes'])} written (estimate)",
            )
        )
        startup = r.get("startup_seconds")
        lines.append(
            (
                "start-up",
                f"{_duration(startup)} until the GPUs first worked, {_gib(r['startup_read_bytes'])} read (estimate)"
                if startup is not None
                else "the GPUs never became active",
            )
        )
    return lines


def job_page_documents(
    conn: Connection, q: JobQuery, points: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """job_document and job_timeline (at most POINTS points per GPU) of one read of the job:
    what the job page shows. None when the job is not found in the query's scope."""
    found = _found(conn, q)
    if found is None:
        return None
    timeline = job_timeline(conn, q, points=points, found=found)
    assert timeline is not None
    return _reports(conn, q, found), timeline


def _job_series(
    conn: Connection, q: JobQuery, points: int | None = None, found: _Found | None = None
) -> tuple[list[AttemptView], list[tuple[AttemptView, GpuFigures, GpuSeries]]] | None:
    """The job's attempts and, per mapped GPU of each started attempt (oldest attempt first, in
    the order gpu_figures gives: per node, as nvidia-smi numbers the GPUs), its series of
    windows (with POINTS, at most that many per GPU: slices of the attempt, each the highest of
    its windows); None when the job is not found in the query's scope."""
    from slurmtel.reports.plot import utilisation_series
    from slurmtel.store.jobview import util_windows

    found = found or _found(conn, q)
    if found is None:
        return None
    attempts, figures = found.attempts, found.figures
    series: list[tuple[AttemptView, GpuFigures, GpuSeries]] = []
    for a in sorted(attempts, key=lambda a: a.submit_at):
        if a.start_at is None:
            continue
        gpus = [g for g in figures[a.key] if g.mapped and g.gpu_uuid]
        end = a.end_at or q.now
        span = (end - a.start_at).total_seconds()
        # slices shorter than a sample window would only repeat the windows
        slice_seconds = span / points if points and span / points > MIN_SLICE_SECONDS else None
        windows = util_windows(
            conn, [g.gpu_uuid for g in gpus], start=a.start_at, end=end, slice_seconds=slice_seconds
        )
        points_of = utilisation_series(windows)
        for g in gpus:
            series.append((a, g, plot_series(g, points_of.get(g.gpu_uuid, []), a, several=len(attempts) > 1)))
    return attempts, series


def job_plot(conn: Connection, q: JobQuery, fmt: str) -> tuple[bytes, bool] | None:
    """The job's GPU utilisation, memory and power over time as FMT (png, svg, pdf) bytes, and
    whether any GPU had telemetry; None when the job is not found in the query's scope."""
    from slurmtel.reports.plot import plot_job, plot_title

    found = _job_series(conn, q)
    if found is None:
        return None
    attempts, triples = found
    series = [s for _, _, s in triples]
    now, zone = q.now, q.zone
    latest = attempts[0]
    running = latest.end_at is None and latest.start_at is not None
    elapsed = (latest.end_at or now) - latest.start_at if latest.start_at else None
    title = plot_title(
        job_id=latest.job_id,
        name=latest.name,
        user=latest.user,
        cluster=latest.cluster,
        state=latest.state,
        elapsed=_duration(elapsed.total_seconds()) if elapsed is not None else "not started",
        running=running,
        gpus=latest.alloc_gpus,
        gpu_model=latest.gpu_model,
        attempts=len(attempts),
    )
    buffer = io.BytesIO()
    plot_job(series, buffer, title=title, zone=zone, fmt=fmt, so_far=running)
    return buffer.getvalue(), any(s.points for s in series)


# one point of a GPU's timeline (`/v1/jobs/{id}/timeline`, the job page's charts)
TIMELINE_POINT_COLUMNS = (
    "window_start_at",
    "window_seconds",
    "util_share",
    "memory_used_bytes",
    "power_watts",
)
# one hardware event on one of the job's GPUs while an attempt ran
EVENT_COLUMNS = ("event_at", "gpu", "gpu_uuid", "attempt", "event_kind", "event_value", "event_detail")


# the smallest slice job_timeline's POINTS makes (the agent's windows are 30 s)
MIN_SLICE_SECONDS = 60.0


def job_timeline(
    conn: Connection, q: JobQuery, *, points: int | None = None, found: _Found | None = None
) -> dict[str, Any] | None:
    """The job's per-GPU windows (utilisation as a share, memory, power) and the XID/ECC events
    of its GPUs while each attempt ran: what the job page draws, and its JSON. With POINTS, at
    most that many points per GPU and attempt, each a slice of the attempt holding the highest
    utilisation, memory and power of its windows. None when the job is not found in the
    query's scope."""
    from slurmtel.store.jobview import gpu_events

    series = _job_series(conn, q, points, found)
    if series is None:
        return None
    attempts, triples = series
    gpus = []
    events: list[dict[str, Any]] = []
    for a, g, s in triples:
        gpus.append(
            {
                "attempt": a.attempt_number,
                "gpu": g.name,
                "gpu_uuid": g.gpu_uuid,
                "node": g.node,
                "idle_gpu": s.idle,
                "idle_share": s.idle_share,
                "memory_total_bytes": s.memory_total_bytes,
                "power_limit_watts": s.power_limit_watts,
                "start_at": a.start_at,
                "end_at": a.end_at,
                "so_far_at": q.now if a.end_at is None else None,
                "points": [
                    {
                        "window_start_at": p.start_at,
                        "window_seconds": p.seconds,
                        "util_share": _percent_share(p.util_percent),
                        "memory_used_bytes": p.memory_used_bytes,
                        "power_watts": None if p.power_watts is None else round(p.power_watts, 1),
                    }
                    for p in s.points
                ],
            }
        )

    for a in attempts:
        names = {g.gpu_uuid: g.name for b, g, _ in triples if b is a}
        if a.start_at is None or not names:
            continue
        for e in gpu_events(conn, list(names), start=a.start_at, end=a.end_at or q.now):
            events.append({**e, "gpu": names[e["gpu_uuid"]], "attempt": a.attempt_number})
    events.sort(key=lambda e: (e["event_at"], e["gpu"]))
    return {
        "job_id": attempts[0].job_id,
        "cluster": attempts[0].cluster,
        "idle_threshold_share": IDLE_GPU_SHARE,
        "gpus": gpus,
        "events": [{c: e.get(c) for c in EVENT_COLUMNS} for e in events],
    }


def write_job(reports: Sequence[Mapping[str, Any]], out: TextIO, fmt: str, zone: tzinfo) -> None:
    if fmt == "json":
        json.dump(jsonable(reports), out, indent=2)
        out.write("\n")
    else:
        write_job_text(reports, out, zone)


def plot_series(
    g: GpuFigures, points: Sequence[SeriesPoint], attempt: AttemptView, *, several: bool
) -> GpuSeries:
    """One GPU's row: `node/index`, the attempt where a job has several, its idle share, its
    memory capacity and power limit."""
    from slurmtel.reports.plot import GpuSeries

    label = g.name + (f" (attempt {attempt.attempt_number})" if several else "")
    share = g.idle_share
    return GpuSeries(
        label,
        list(points),
        idle=share is not None and share >= IDLE_GPU_SHARE,
        idle_share=share,
        memory_total_bytes=g.memory_total_bytes,
        power_limit_watts=g.power_limit_watts,
        node=g.node,
    )


# ------------------------------------------------------------------------------------- me


def month_of(moment: datetime, zone: tzinfo) -> str:
    """The site month (YYYY-MM) MOMENT falls in."""
    local = moment.astimezone(zone)
    return f"{local.year:04d}-{local.month:02d}"


def _seconds(value: Any) -> float:
    return round(float(value or 0), 3)


def jsonable(document: Any, column: str = "") -> Any:
    """DOCUMENT (a job's attempts, a month) as its JSON carries it, as every report's does:
    money an exact string, other exact decimals numbers (slurmtel.columns), instants ISO 8601."""
    from slurmtel.columns import COLUMNS, Kind

    if isinstance(document, Mapping):
        return {k: jsonable(v, k) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [jsonable(v, column) for v in document]
    if isinstance(document, Decimal):
        col = COLUMNS.get(column)
        return str(document) if col is None or col.kind is Kind.MONEY else float(document)
    if isinstance(document, datetime):
        return document.isoformat()
    return document


def _util_share(util_weighted: Any, covered: float) -> float | None:
    # util_weighted is Σ covered seconds × utilisation in percent
    return round(float(util_weighted or 0) / covered / 100, 4) if covered > 0 else None


def me_summary(
    user: str, month: str, usage: Mapping[str, Any], pricing: ChargebackConfig | None = None
) -> dict[str, Any]:
    covered = float(usage["t_covered"])
    energy = usage.get("t_energy")
    measured = [] if energy is None else [GpuEnergy(float(energy))]
    figures = gpu_energy_figures(measured, pricing)
    return {
        "user": user,
        "month": month,
        "jobs": int(usage["jobs"]),
        "attempts": int(usage["attempts"]),
        "allocated_gpu_seconds": _seconds(usage["gpu_seconds"]),
        "failed_gpu_seconds": _seconds(usage["failed_gpu_seconds"]),
        "covered_gpu_seconds": _seconds(covered),
        "unmeasured_gpu_seconds": _seconds(usage["t_unmeasured"]),
        "idle_gpu_seconds": _seconds(usage["t_idle"]),
        "idle_share": _share(float(usage["t_idle"]), covered),
        "mean_util_share": _util_share(usage["t_util_weighted"], covered),
        # the GPUs' measured energy, with its price and CO2e when configured
        **figures,
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
        "allocated_gpu_seconds": _seconds(row["gpu_seconds"]),
        "idle_share": _share(float(row["idle"] or 0), covered),
        "mean_util_share": _util_share(row["util_weighted"], covered),
        "covered_share": _share(covered, float(row["allocated"] or 0)),
    }


def me_job_row(row: Mapping[str, Any], zone: tzinfo) -> dict[str, Any]:
    """One attempt of `me --jobs` (ME_JOBS_COLUMNS)."""
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
        "start_at": row["start_at"],
        "elapsed_seconds": None if elapsed is None else round(elapsed, 3),
        "gpus": int(row["alloc_gpus"]),
        "allocated_gpu_seconds": _seconds(row["gpu_seconds"]),
        "mean_util_share": _util_share(row["util_weighted"], covered),
        "idle_share": _share(float(row["idle"] or 0), covered),
        "cpu_efficiency_share": _percent_share(e.cpu_efficiency_percent),
        "mem_peak_bytes": e.mem_peak_bytes,
        "mem_requested_bytes": e.mem_requested_bytes,
        "mem_efficiency_share": _percent_share(e.mem_efficiency_percent),
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
    document["summary"] = me_summary(user, month, usage, q.pricing)
    document["top_jobs"] = [me_top_job(r) for r in top_jobs(conn, **window, limit=q.top)]
    document["actions"] = me_actions(conn, q)
    return document


# the warnings and actions `me` lists: those of the last ME_ACTIONS_DAYS, at most ME_ACTIONS_LIMIT
ME_ACTIONS_DAYS = 30
ME_ACTIONS_LIMIT = 20
ME_ACTIONS_COLUMNS = ("decided_at", "job_id", "rule", "step", "status", "title")


def me_actions(conn: Connection, q: MeQuery) -> list[dict[str, Any]]:
    """The warnings, cancellations and summaries about the user's jobs ([actions]), newest first."""
    from datetime import timedelta

    from slurmtel.store.actions import action_log

    rows = action_log(
        conn,
        scope=q.scope,
        user=q.user,
        since=q.now - timedelta(days=ME_ACTIONS_DAYS),
        limit=ME_ACTIONS_LIMIT,
    )
    return [
        {
            "decided_at": r["decided_at"].isoformat(),
            "job_id": r["job_id"],
            "rule": r["rule"],
            "step": r["step"],
            "status": r["status"],
            "title": r["title"],
            "reason": r["reason"],
        }
        for r in rows
        if r["job_id"]
    ]


def write_me(document: Mapping[str, Any], out: TextIO, fmt: str) -> None:
    user, month, zone = document["user"], document["month"], document["zone"]
    so_far = " (so far)" if document["so_far"] else ""
    if "jobs" in document:
        rows = document["jobs"]
        title = (
            f"Jobs of {user} in {month}{so_far} ({zone}): {len(rows)} attempt{'s' if len(rows) != 1 else ''}"
        )
        render(rows, out, fmt, columns=ME_JOBS_COLUMNS, title=title, first=ME_JOBS_KEY_COLUMNS)
        return
    summary, top = document["summary"], document["top_jobs"]
    if fmt == "json":
        json.dump(
            jsonable({**summary, "top_jobs": top, "actions": document.get("actions") or []}), out, indent=2
        )
        out.write("\n")
        return
    # the energy figures only where measured (and priced)
    rows = [
        {"figure": k, "value": summary.get(k)}
        for k in (*ME_SUMMARY_COLUMNS, *ME_ENERGY_COLUMNS)
        if k in ME_SUMMARY_COLUMNS or summary.get(k) is not None
    ]
    render(rows, out, "table", columns=["figure", "value"], title=f"GPU use of {user} in {month}{so_far}")
    out.write("\n")
    title = f"Top {len(top)} jobs by GPU-hours in {month}" if top else f"No jobs in {month}"
    render(
        top,
        out,
        "table",
        columns=TOP_COLUMNS,
        title=title,
        first=("job_id", "allocated_gpu_seconds", "idle_share"),
    )
    actions = document.get("actions") or []
    if actions:
        out.write("\n")
        render(
            actions,
            out,
            "table",
            columns=ME_ACTIONS_COLUMNS,
            title=f"Warnings and actions about your jobs, last {ME_ACTIONS_DAYS} days (slurmtel act log)",
        )
